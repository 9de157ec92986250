//! One configured server as the pipeline holds it: its connection (in
//! [`crate::transport`]) and what the pipeline keeps beside it per server,
//! its breaker, its retry budget and its tool calls in flight.
//!
//! Place: in every server's state ([`super::state::ServerState`]); the
//! forwarding step reads the breaker and budget around each exchange, and
//! hands the exchange itself to the connection. Invariant: the connection
//! knows nothing of this state; a readiness report joins both here.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};

use super::breaker::Breaker;
use super::inflight::InFlight;
use super::retry::Budget;
use crate::config::ServerSettings;
use crate::identity::Credential;
use crate::transport::Connection;
use crate::transport::reply::{Reply, UpstreamError};

/// One configured server: its connection and the pipeline's state for it.
#[derive(Debug)]
pub(crate) struct Upstream {
    pub settings: Arc<ServerSettings>,
    connection: Connection,
    /// How many of this server's requests were retried lately.
    pub budget: Budget,
    /// Whether the server is answered for without being contacted.
    pub breaker: Breaker,
    /// Its tool calls under way, for the clients' cancellations.
    pub in_flight: InFlight,
}

impl Upstream {
    /// The upstream of `settings`; a stdio server's process is started at once
    /// (inside a Tokio runtime). `tools_changed` is called when a stdio server
    /// announces (or a restart may bring) a different tool list.
    pub(crate) fn new(
        settings: Arc<ServerSettings>,
        max_response_bytes: usize,
        tools_changed: Box<dyn Fn() + Send + Sync>,
    ) -> Result<Self, reqwest::Error> {
        let connection = Connection::new(settings.clone(), max_response_bytes, tools_changed)?;
        Ok(Self {
            settings,
            connection,
            budget: Budget::default(),
            breaker: Breaker::default(),
            in_flight: InFlight::default(),
        })
    }

    /// Cap on a JSON reply and on one SSE event.
    pub(crate) fn max_response_bytes(&self) -> usize {
        self.connection.max_response_bytes
    }

    /// One exchange over the server's transport (see [`Connection::exchange`]).
    pub(crate) async fn exchange(
        &self,
        method: Method,
        headers: HeaderMap,
        credential: Credential,
        body: Option<Bytes>,
        idle: Option<Duration>,
    ) -> Result<Reply, UpstreamError> {
        (self.connection)
            .exchange(method, headers, credential, body, idle)
            .await
    }

    /// For `/readyz`: the connection's report, with the breaker's phase.
    pub(crate) fn readiness(&self) -> (bool, serde_json::Value) {
        let (ready, mut body) = self.connection.readiness();
        // Degraded, not down: an open breaker answers for the server.
        if let Some(body) = body.as_object_mut() {
            body.insert("breaker".into(), self.breaker.phase().as_str().into());
        }
        (ready, body)
    }

    /// Stops what the upstream runs (a stdio server's process) and waits for it.
    pub(crate) async fn stop(&self) {
        self.connection.stop().await;
    }
}
