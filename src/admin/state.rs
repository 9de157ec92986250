//! What only the admin listener needs: the file the configuration is
//! reloaded from, the reload lock and last outcome, the metrics it serves,
//! the dashboard's live ring, and a handle to the gateway's shared state.
//!
//! Place: the bottom of the admin layer. Invariant: the MCP data path never
//! sees this state (it holds [`AppState`], which knows nothing of admin).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::audit::Audit;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::state::AppState;
use crate::record::live::Recent;

/// Shared by every admin request.
#[derive(Debug)]
pub(crate) struct AdminState {
    /// The gateway's shared state (configuration, pins, sessions, streams).
    pub app: Arc<AppState>,
    /// The admin listener is on a loopback address (Host checks apply; off
    /// it, every read needs the admin token).
    pub loopback: bool,
    /// The file the configuration is reloaded from (none when started from text).
    pub config_path: Option<PathBuf>,
    /// Serializes reloads.
    pub reloads: tokio::sync::Mutex<()>,
    /// The outcome of the last reload, and counts.
    pub reload_status: Mutex<Status>,
    /// The Prometheus registry served at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The latest events, and the live feed.
    pub recent: Arc<Recent>,
    /// The audit store, for `/healthz` (none in tests that build no app).
    pub audit: Option<Arc<Audit>>,
}

impl AdminState {
    /// The admin state beside `app`.
    pub(crate) fn new(
        app: Arc<AppState>,
        loopback: bool,
        config_path: Option<PathBuf>,
        metrics: Arc<Metrics>,
        recent: Arc<Recent>,
    ) -> Self {
        Self {
            app,
            loopback,
            config_path,
            reloads: tokio::sync::Mutex::new(()),
            reload_status: Mutex::new(Status::default()),
            metrics,
            recent,
            audit: None,
        }
    }

    /// The same, reporting `audit` at `/healthz`.
    pub(crate) fn with_audit(mut self, audit: Arc<Audit>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// The configuration in force now.
    pub(crate) fn config(&self) -> Arc<Config> {
        self.app.config()
    }
}

/// The last reload's outcome, and counts since start.
#[derive(Debug, Default, Clone)]
pub(crate) struct Status {
    /// The last reload applied its configuration (`None`: none attempted).
    pub ok: Option<bool>,
    /// When the last reload finished (ms since the epoch).
    pub at_ms: Option<u64>,
    /// What asked for it: `sighup`, `file`, `api`.
    pub trigger: Option<&'static str>,
    /// Why the last reload was refused.
    pub error: Option<String>,
    /// Reloads applied since start.
    pub applied: u64,
    /// Reloads refused since start.
    pub refused: u64,
}
