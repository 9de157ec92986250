//! The running gateway: listeners, shared state, graceful shutdown.
//!
//! Place in the path: owns the sockets; hands each MCP request to the proxy
//! router and each admin request to the admin router.
//!
//! Invariants: both listeners are bound before anything is served (so a port
//! clash fails start-up, not the first request); shutdown stops accepting at
//! once and gives in-flight requests at most `shutdown_grace` to finish; pins
//! and audit events still queued are written, spans still queued are
//! exported, and stdio servers' processes stopped, before `run` returns; a
//! gateway started from a file watches that file and reloads it (see
//! [`crate::admin::reload`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod serve;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::reload;
use crate::admin::state::AdminState;
use crate::audit::Audit;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pins::Pins;
use crate::proxy::{self, state::AppState};
use crate::ratelimit;
use crate::record::live::Recent;
use crate::record::sink::{Sink, Sinks};
use crate::telemetry::Traces;

/// A gateway with its sockets bound, ready to serve.
#[derive(Debug)]
pub struct Gateway {
    /// The admin listener's state, with the gateway's shared state inside.
    admin_state: Arc<AdminState>,
    /// The audit store, flushed at shutdown.
    audit: Arc<Audit>,
    /// Watch the configuration file (when started from one).
    watch: bool,
    listener: TcpListener,
    admin: TcpListener,
}

/// A gateway serving in the background.
#[derive(Debug)]
pub struct GatewayHandle {
    /// Where MCP clients connect.
    pub addr: SocketAddr,
    /// Where the admin endpoints are.
    pub admin_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<io::Result<()>>,
}

impl Gateway {
    /// Binds the MCP and admin listeners of `config`.
    pub async fn bind(config: Config) -> io::Result<Self> {
        Self::bind_with(config, None).await
    }

    /// Loads the file at `path` and binds its listeners; the gateway reloads
    /// the file when it changes, on [`Reloader::reload`] and on `POST /api/reload`.
    pub async fn bind_file(path: &Path) -> io::Result<Self> {
        let owned = path.to_path_buf();
        let config = tokio::task::spawn_blocking(move || {
            crate::config::load(&owned).map_err(|e| e.to_string())
        })
        .await
        .map_err(io::Error::other)?
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Self::bind_with(config, Some(path.to_path_buf())).await
    }

    async fn bind_with(config: Config, path: Option<PathBuf>) -> io::Result<Self> {
        install_crypto_provider();
        // The built-in detectors are compiled before the gateway listens, so
        // start-to-ready includes them and the first call is not slower.
        tokio::task::spawn_blocking(|| {
            crate::sanitize::prepare();
            crate::pins::scan::prepare();
        })
        .await
        .map_err(io::Error::other)?;
        let listener = TcpListener::bind(config.gateway.listen).await?;
        let admin = TcpListener::bind(config.gateway.admin_listen).await?;
        let loopback = listener.local_addr()?.ip().is_loopback();
        let admin_loopback = admin.local_addr()?.ip().is_loopback();
        // Opening and loading the store reads the disk: off the async threads.
        let (database, source) = (config.pins.database.clone(), config.source.clone());
        let pins = tokio::task::spawn_blocking(move || Pins::open(database.as_deref(), &source))
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)?;
        let settings = config.audit.clone();
        let audit = tokio::task::spawn_blocking(move || Audit::open(&settings))
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)?;
        let traces = Arc::new(Traces::start(&config.telemetry).map_err(io::Error::other)?);
        // The sinks of every finished request, in the order they see it.
        let metrics = Arc::new(Metrics::new(audit.shared_counters(), traces.counters()));
        let recent = Arc::new(Recent::default());
        let sinks = Sinks::new(vec![
            metrics.clone() as Arc<dyn Sink>,
            recent.clone(),
            audit.clone(),
        ]);
        let state = AppState::new(Arc::new(config), pins, Arc::new(sinks), traces, loopback)?;
        let admin_state = AdminState::new(Arc::new(state), admin_loopback, path, metrics, recent)
            .with_audit(audit.clone());
        Ok(Self {
            admin_state: Arc::new(admin_state),
            audit,
            watch: true,
            listener,
            admin,
        })
    }

    /// The bound MCP address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    /// Whether to reload when the configuration file changes (default on;
    /// SIGHUP and `POST /api/reload` work either way).
    pub fn watch_file(mut self, on: bool) -> Self {
        self.watch = on;
        self
    }

    /// A handle that reloads the configuration file (for SIGHUP).
    pub fn reloader(&self) -> Reloader {
        Reloader {
            state: self.admin_state.clone(),
        }
    }

    /// Serves until `shutdown` resolves, then drains for at most `shutdown_grace`.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
        let app = self.admin_state.app.clone();
        let janitor = app.limiter.spawn_janitor(ratelimit::JANITOR_EVERY);
        let _janitor = AbortOnDrop(janitor);
        // A fleet's pin approvals, applied off the request path.
        let _pin_sync = app.approvals.shared.is_shared().then(|| {
            let pins = app.pins.clone();
            AbortOnDrop(Some(tokio::spawn(crate::pins::fleet::sync(
                app.approvals.shared.clone(),
                move |key, hash, by| pins.approve(key, Some(hash), by),
            ))))
        });
        let _watch = match &self.admin_state.config_path {
            Some(path) if self.watch => match reload::watch(self.admin_state.clone(), path) {
                Ok(guard) => Some(guard),
                Err(e) => {
                    tracing::warn!(error = %e, file = %path.display(),
                        "cannot watch the configuration file; reload with SIGHUP or POST /api/reload");
                    None
                }
            },
            _ => None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let mcp = proxy::router(app.clone());
        let admin = crate::admin::router(self.admin_state.clone());
        let wait = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        };
        // Connection deadlines and caps are read at start; a reload does not change them.
        let gateway = &app.config().gateway;
        let limits = serve::Limits {
            client_timeout: gateway.client_timeout,
            header_timeout: gateway.header_timeout,
            max_connections: gateway.max_connections,
        };
        let metrics = &self.admin_state.metrics;
        let mcp_server = serve::serve(
            self.listener,
            mcp,
            limits,
            metrics.mcp_connections.clone(),
            wait(stop_rx.clone()),
        );
        let admin_server = serve::serve(
            self.admin,
            admin,
            limits,
            metrics.admin_connections.clone(),
            wait(stop_rx.clone()),
        );
        let servers = async { tokio::try_join!(mcp_server, admin_server).map(|_| ()) };
        tokio::pin!(servers);
        let (pins, audit) = (app.pins.clone(), self.audit.clone());
        let state = app.clone();
        let traces = app.traces.clone();
        let flush = || async move {
            // Stdio servers' processes end with the gateway.
            state.stop_upstreams().await;
            // Pins and audit events not yet on disk are written, and spans not
            // yet exported are sent, before the process ends.
            let _ = tokio::task::spawn_blocking(move || {
                pins.flush();
                audit.flush();
                traces.flush();
            })
            .await;
        };
        tokio::select! {
            result = &mut servers => {
                flush().await;
                return result;
            }
            () = shutdown => {}
        }
        // The grace of the configuration in force when the signal came.
        let grace = app.config().gateway.shutdown_grace;
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "shutting down: no new connections, finishing in-flight requests"
        );
        let _ = stop_tx.send(true);
        self.admin_state.recent.close();
        let result = match tokio::time::timeout(grace, servers).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    "shutdown grace elapsed with requests still in flight; closing them"
                );
                Ok(())
            }
        };
        flush().await;
        result
    }

    /// Binds and serves in a background task.
    pub async fn start(config: Config) -> io::Result<GatewayHandle> {
        Self::spawn(Self::bind(config).await?)
    }

    /// As [`Gateway::start`], from a file that is watched and reloaded.
    pub async fn start_file(path: &Path) -> io::Result<GatewayHandle> {
        Self::spawn(Self::bind_file(path).await?)
    }

    fn spawn(gateway: Self) -> io::Result<GatewayHandle> {
        let addr = gateway.local_addr()?;
        let admin_addr = gateway.admin_addr()?;
        let (stop, mut rx) = watch::channel(false);
        let task = tokio::spawn(gateway.run(async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
        Ok(GatewayHandle {
            addr,
            admin_addr,
            stop,
            task,
        })
    }
}

/// Reloads a gateway's configuration file.
#[derive(Debug, Clone)]
pub struct Reloader {
    state: Arc<AdminState>,
}

impl Reloader {
    /// Loads the file again and swaps it in; `Err` is the refusal (already
    /// logged and counted), and the running configuration stays.
    pub async fn reload(&self, trigger: &'static str) -> Result<(), String> {
        reload::from_file(&self.state, trigger).await
    }
}

impl GatewayHandle {
    /// `http://ADDR/mcp/<server>`.
    pub fn url(&self, server: &str) -> String {
        format!("http://{}/mcp/{server}", self.addr)
    }

    /// Stops serving and waits for the drain to finish.
    pub async fn shutdown(self) -> io::Result<()> {
        let _ = self.stop.send(true);
        self.task.await.map_err(io::Error::other)?
    }
}

/// Stops a background task when the server stops.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// reqwest is built without a default TLS provider; install ring once.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
