//! The [`Context`] of one request: everything the gateway knows about it as
//! it goes, handed to every step. The two things a step needs to reach the
//! server and to answer the client are derived from it here, and only here:
//! the [`Forward`] ([`Context::forward_to`]) and the [`Recipient`]
//! ([`Context::recipient`]).
//!
//! Place: the bottom of the pipeline's steps; the conductor
//! ([`super::conductor`]) creates one per request and every step takes it.
//! Invariants: a request is decided under one loaded configuration
//! ([`Live`]) to its end; no step assembles a `Forward` or a `Recipient` by
//! hand (`tests/suite/typed_request.rs` keeps it so).

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::flow;
use super::forward::Forward;
use super::state::{AppState, Live, ServerState};
use crate::proxy::catalog::CallFacts;
use crate::proxy::respond::{Recipient, Shown};
use crate::proxy::tasks::TaskScope;

use crate::auth::{ClientId, PresentedToken};
use crate::config::Mode;
use crate::error::{Rejection, RenderCtx};
use crate::identity::Caller;
use crate::mcp::methods::Method as Rpc;
use crate::mcp::request::Request;
use crate::mcp::version::Era;
use crate::record::trail::Trail;

/// What the gateway knows about the request so far.
pub(super) struct Context {
    pub(super) state: Arc<AppState>,
    /// The configuration in force when the request arrived, for all of it.
    pub(super) live: Arc<Live>,
    pub(super) started: Instant,
    pub(super) client: Option<ClientId>,
    /// The JWT the client authenticated with (not an API key): the subject of
    /// a token exchange, the claims of an identity template.
    pub(super) token: Option<PresentedToken>,
    /// The server entered (`None` before routing, and for what the merged
    /// view answers itself).
    pub(super) server: Option<String>,
    /// The method as received (or the HTTP method), for the audit and logs.
    pub(super) method: String,
    /// The method of the specification the request was typed as, once it is.
    pub(super) rpc: Option<Rpc>,
    pub(super) id: Option<Value>,
    pub(super) era: Era,
    pub(super) tool: Option<String>,
    /// What a resource, prompt, completion or listen request is about, for
    /// the audit ([`super::about`]); never a tool's name, which is `tool`.
    pub(super) subject: Option<String>,
    /// In observe mode: what enforcement would have refused the request with.
    pub(super) would_refuse: Option<&'static str>,
    /// The mode the request is decided under.
    pub(super) mode: Mode,
    /// The audit event; later stages note on it what they learn.
    pub(super) trail: Arc<Trail>,
    /// In the merged view: `<server>__`, how the client knows this server's tools.
    pub(super) prefix: String,
    /// The handshake-era session the client presented (the merged view's own
    /// in the merged view): what its `initialize` declared is known by it.
    pub(super) client_session: Option<String>,
    /// What the tool step learned of the called tool, for the reply's checks.
    pub(super) call: CallFacts,
    /// The flow label the called tool's result sets in the caller's session.
    pub(super) flow: Option<crate::flow::Recording>,
}

impl Context {
    /// A request just arrived, decided under `live`.
    pub(super) fn new(
        state: Arc<AppState>,
        live: Arc<Live>,
        trail: Arc<Trail>,
        started: Instant,
        method: &str,
    ) -> Self {
        Self {
            state,
            live,
            started,
            client: None,
            token: None,
            server: None,
            method: crate::util::text::clip(method),
            rpc: None,
            id: None,
            era: Era::Legacy,
            tool: None,
            subject: None,
            would_refuse: None,
            mode: Mode::Enforce,
            trail,
            prefix: String::new(),
            client_session: None,
            call: CallFacts::default(),
            flow: None,
        }
    }

    /// Whom the upstream requests of this request are sent for.
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

    /// The request is now about `server`: it is recorded, and its mode applies.
    pub(super) fn enter(&mut self, server: &ServerState) {
        self.server = Some(server.upstream.settings.name.clone());
        self.mode = self.mode_at(server);
    }

    /// The mode a request about `server` is decided in: its own, else the gateway's.
    pub(super) fn mode_at(&self, server: &ServerState) -> Mode {
        (server.upstream.settings.mode).unwrap_or(self.live.config.gateway.mode)
    }

    /// How this request's messages reach `server` for `client`: with the
    /// server's own handshake-era `session`, and for a `subscriptions/listen`
    /// (`listen`) with no idle limit. The one place a [`Forward`] is made.
    pub(super) fn forward_to(
        &self,
        client: &ClientId,
        server: &Arc<ServerState>,
        session: Option<String>,
        listen: bool,
    ) -> Forward {
        Forward {
            state: self.state.clone(),
            live: self.live.clone(),
            server: server.clone(),
            era: self.era,
            session,
            trail: self.trail.clone(),
            listen,
            caller: self.caller(client),
        }
    }

    /// Who the reply from `server` is for, and what it must be checked
    /// against: the one place a [`Recipient`] is made.
    pub(super) fn recipient(&self, server: &ServerState) -> Recipient {
        let tasks = self.client.clone().map(|client| TaskScope {
            store: self.state.tasks.clone(),
            client,
            creates: self.rpc == Some(Rpc::ToolsCall),
        });
        Recipient {
            shown: self.shown(self.mode),
            tasks,
            id: self.id.clone(),
            method: self.method.clone(),
            rpc: self.rpc,
            era: self.era,
            server: server.upstream.settings.name.clone(),
            tool: self.tool.clone(),
            catalog: server.catalog.clone(),
            sanitize: self.live.sanitize.clone(),
            call: self.call.clone(),
            trail: self.trail.clone(),
            flow: self.flow.clone(),
        }
    }

    /// Which resources a reply decided in `mode` may name to this client
    /// (`None` in observe mode, whose lists show every resource, so name
    /// every one).
    pub(super) fn shown(&self, mode: Mode) -> Option<Shown> {
        (self.client.clone())
            .filter(|_| mode != Mode::Observe)
            .map(|client| Shown {
                state: self.state.clone(),
                client,
                token: self.token.clone(),
            })
    }

    /// The flow session of a call of `client` to `server` ([`flow::key`]).
    pub(super) fn flow_key(
        &self,
        client: &ClientId,
        server: &str,
        message: &Request,
    ) -> crate::flow::SessionKey {
        let merged = !self.prefix.is_empty();
        let presented = (self.era, self.client_session.as_deref(), merged);
        flow::key(presented, client, server, message)
    }

    /// In observe mode a policy, rate-limit or validation refusal is
    /// recorded, not enforced (`None`); every other refusal (transport,
    /// headers, parameters) is enforced always.
    pub(super) fn observe_or_enforce<T>(
        &mut self,
        decided: Result<T, Rejection>,
    ) -> Result<Option<T>, Rejection> {
        match decided {
            Ok(value) => Ok(Some(value)),
            Err(
                rejection @ (Rejection::Tool(_)
                | Rejection::Use(_)
                | Rejection::NotFound(_)
                | Rejection::RateLimited(_)
                | Rejection::SecretInParams(_)),
            ) if self.mode == Mode::Observe => {
                self.would_refuse = Some(rejection.code());
                Ok(None)
            }
            Err(other) => Err(other),
        }
    }
}

/// The bytes a call is forwarded as: the typed request serialised once,
/// canonically ([`crate::util::canonical`]), never the client's own spelling,
/// so the arguments the server receives are byte-for-byte those an approval
/// binds and a person is shown.
pub(super) fn canonical_body(request: &Request) -> bytes::Bytes {
    bytes::Bytes::from(crate::util::canonical::to_vec(&request.to_value()))
}
