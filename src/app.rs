//! The running gateway: listeners, shared state, graceful shutdown.
//!
//! Place in the path: owns the sockets; hands each MCP request to the proxy
//! router and each admin request to the admin router.
//!
//! Invariants: both listeners are bound before anything is served (so a port
//! clash fails start-up, not the first request); shutdown stops accepting at
//! once and gives in-flight requests at most `shutdown_grace` to finish; pins
//! and audit events still queued are written before `run` returns.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::audit::Audit;
use crate::config::Config;
use crate::pins::Pins;
use crate::proxy::{self, AppState};
use crate::{admin, dashboard};

/// A gateway with its sockets bound, ready to serve.
#[derive(Debug)]
pub struct Gateway {
    state: Arc<AppState>,
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
        install_crypto_provider();
        let listener = TcpListener::bind(config.gateway.listen).await?;
        let admin = TcpListener::bind(config.gateway.admin_listen).await?;
        let loopback = listener.local_addr()?.ip().is_loopback();
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
        let state =
            AppState::new(Arc::new(config), pins, audit, loopback).map_err(io::Error::other)?;
        Ok(Self {
            state: Arc::new(state),
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

    /// Serves until `shutdown` resolves, then drains for at most `shutdown_grace`.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
        let grace = self.state.config.gateway.shutdown_grace;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mcp = proxy::router(self.state.clone());
        let admin = admin_router(self.state.clone());
        let wait = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        };
        let mcp_server =
            axum::serve(self.listener, mcp).with_graceful_shutdown(wait(stop_rx.clone()));
        let admin_server =
            axum::serve(self.admin, admin).with_graceful_shutdown(wait(stop_rx.clone()));
        let servers = async {
            tokio::try_join!(mcp_server.into_future(), admin_server.into_future()).map(|_| ())
        };
        tokio::pin!(servers);
        let (pins, audit) = (self.state.pins.clone(), self.state.audit.clone());
        let flush = || async move {
            // Pins and audit events not yet on disk are written before the process ends.
            let _ = tokio::task::spawn_blocking(move || {
                pins.flush();
                audit.flush();
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
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "shutting down: no new connections, finishing in-flight requests"
        );
        let _ = stop_tx.send(true);
        self.state.recent.close();
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
        let gateway = Self::bind(config).await?;
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

fn admin_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|| async { "ready\n" }))
        .route("/metrics", get(admin::metrics))
        .route("/", get(dashboard::index))
        .route("/api/events", get(dashboard::events))
        .route("/api/events/stream", get(dashboard::stream))
        .route("/api/events/{id}", get(dashboard::event))
        .route("/api/overview", get(dashboard::overview))
        .route("/api/config", get(dashboard::config))
        .route("/api/pins", get(admin::pins))
        .route("/api/pins/approve", post(admin::approve))
        .with_state(state)
}

/// reqwest is built without a default TLS provider; install ring once.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
