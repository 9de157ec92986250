//! Hot reload: a new configuration file is compiled whole, then swapped in
//! at once, on SIGHUP, on a change of the file, or on `POST /api/reload`.
//!
//! Place in the path: beside it. A request loads the configuration in force
//! once, at its start ([`crate::proxy::Live`]), and finishes under it; a
//! reload only changes what the next request loads.
//!
//! Invariants: a configuration that fails to load, or that changes what
//! cannot change while running (the listener addresses, the pin store), is
//! refused whole and the running one stays; a change of the file is applied
//! only once two reads [`SETTLE`] apart agree, so a file written in several
//! steps is never applied half-way (a half that compiles, say one without
//! its last deny rule, would be weaker than either whole file); every outcome is logged, counted
//! and kept as the last result (`GET /api/reload`). The state of a server
//! whose settings did not change (its HTTP client, tool catalog, compiled
//! schemas) is carried over; a changed server starts afresh. Reloads run one
//! at a time. What a reload revokes (a client, its key, its rights on a
//! server, a server) ends at once on open streams and sessions too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use notify::RecursiveMode;
use notify_debouncer_full::{DebounceEventResult, new_debouncer};
use serde_json::json;

use super::access;
use super::state::AdminState;
use crate::config::{self, Config};
use crate::error::json_response;
use crate::proxy::state::{AppState, Live};

/// How long the file watcher waits for a burst of file events to settle.
const DEBOUNCE: Duration = Duration::from_millis(250);
/// How long a changed file's text must stay the same before it is applied.
/// A writer that pauses longer mid-file is not told apart from two edits:
/// replacing the file by rename is the way to be sure.
pub(crate) const SETTLE: Duration = Duration::from_secs(1);
/// Most reads of a file that keeps changing; then the change is refused
/// (the next change of the file starts again).
const MAX_READS: usize = 30;

/// Reloads the configuration from the file the gateway was started with.
///
/// Returns the refusal's text when the new configuration is not applied.
pub(crate) async fn from_file(
    state: &Arc<AdminState>,
    trigger: &'static str,
) -> Result<(), String> {
    let Some(path) = state.config_path.clone() else {
        return Err(
            "this gateway was not started from a configuration file, so it has nothing to reload"
                .into(),
        );
    };
    let _one_at_a_time = state.reloads.lock().await;
    // A signal or a request asks for the file as it is; a change of the
    // file may be a write still under way.
    let text = if trigger == "file" {
        settled(&path).await
    } else {
        config::read(&path).map_err(|e| e.to_string())
    };
    // Compiling (schemas, regexes, key files) is blocking work.
    let loaded = match text {
        Ok(text) => tokio::task::spawn_blocking(move || {
            config::load_text(&path, &text).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("the reload task failed: {e}"))
        .and_then(|r| r),
        Err(e) => Err(e),
    };
    let result = loaded.and_then(|config| apply(&state.app, config));
    record(state, trigger, &result);
    result
}

/// The file's text once two reads [`SETTLE`] apart agree.
async fn settled(path: &Path) -> Result<String, String> {
    let mut last = config::read(path).map_err(|e| e.to_string())?;
    for _ in 0..MAX_READS {
        tokio::time::sleep(SETTLE).await;
        let now = config::read(path).map_err(|e| e.to_string())?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    Err(format!(
        "{}: the file kept changing for {} s; nothing of it is applied until it stays the same for {} s",
        path.display(),
        SETTLE.as_secs() * MAX_READS as u64,
        SETTLE.as_secs()
    ))
}

/// Swaps `config` in, keeping the state of unchanged servers.
fn apply(state: &AppState, config: Config) -> Result<(), String> {
    let current = state.live.load_full();
    fixed(&current.config, &config)?;
    let live = Live::build(Arc::new(config), Some(&current), &state.pins)
        .map_err(|e| format!("cannot build an upstream HTTP client: {e}"))?;
    let kept = live
        .servers
        .iter()
        .filter(|(name, s)| {
            current
                .servers
                .get(*name)
                .is_some_and(|o| Arc::ptr_eq(o, s))
        })
        .count();
    tracing::info!(
        servers = live.servers.len(),
        unchanged = kept,
        "configuration reloaded"
    );
    let new = live.config.clone();
    state.live.store(Arc::new(live));
    revoke(state, &current.config, &new);
    Ok(())
}

/// Ends what the new configuration no longer grants: the open streams and the
/// sessions of every client that was removed, lost its credential (a new key,
/// no more `[auth.jwt]`), or can use nothing on a server any more (or whose
/// server is gone). Requests in flight finish under the configuration they
/// started with; streams are not requests in flight, they are ended now.
fn revoke(state: &AppState, old: &Config, new: &Config) {
    let revoked = |client: &crate::auth::ClientId, server: &str| {
        !new.servers.contains_key(server)
            || !new.clients.still_admits(&old.clients, client)
            || !new.policy.reaches(client, server)
    };
    let streams = state.streams.revoke(revoked);
    let sessions = state.sessions.end_where(revoked);
    if streams + sessions > 0 {
        tracing::info!(
            streams,
            sessions,
            "the new configuration revokes access: streams and sessions of revoked clients ended"
        );
    }
}

/// What a running gateway cannot change without a restart.
fn fixed(old: &Config, new: &Config) -> Result<(), String> {
    let (o, n) = (&old.gateway, &new.gateway);
    if o.listen != n.listen {
        return Err(format!(
            "{}: `gateway.listen` changed from {} to {}; listener addresses cannot change on reload \
             (restart the gateway to move it); the running configuration stays in force",
            new.source, o.listen, n.listen
        ));
    }
    if o.admin_listen != n.admin_listen {
        return Err(format!(
            "{}: `gateway.admin_listen` changed from {} to {}; listener addresses cannot change on reload \
             (restart the gateway to move it); the running configuration stays in force",
            new.source, o.admin_listen, n.admin_listen
        ));
    }
    if old.rate_limit != new.rate_limit {
        return Err(format!(
            "{}: `[rate_limit]` changed; the bucket store (memory or Redis) is set up at start and cannot \
             change on reload (restart the gateway); the running configuration stays in force",
            new.source
        ));
    }
    if old.state != new.state {
        return Err(format!(
            "{}: `[state]` changed; the state store (memory or Redis) is set up at start and cannot \
             change on reload (restart the gateway); the running configuration stays in force",
            new.source
        ));
    }
    if old.telemetry.otlp_endpoint != new.telemetry.otlp_endpoint {
        return Err(format!(
            "{}: `telemetry.otlp_endpoint` changed; the span exporter is set up at start and cannot \
             change on reload (restart the gateway); the running configuration stays in force",
            new.source
        ));
    }
    if old.pins.database != new.pins.database {
        return Err(format!(
            "{}: `pins.database` changed; the pin store is opened at start and cannot change on reload \
             (restart the gateway); the running configuration stays in force",
            new.source
        ));
    }
    Ok(())
}

fn record(state: &AdminState, trigger: &'static str, result: &Result<(), String>) {
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    let mut status = state
        .reload_status
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    state.metrics.reloaded(result.is_ok());
    status.ok = Some(result.is_ok());
    status.at_ms = Some(at_ms);
    status.trigger = Some(trigger);
    match result {
        Ok(()) => {
            status.applied += 1;
            status.error = None;
        }
        Err(e) => {
            status.refused += 1;
            status.error = Some(e.clone());
            tracing::error!(trigger, refused = status.refused, error = %e,
                "configuration reload refused; the running configuration stays in force");
        }
    }
}

/// Watches the configuration file's directory (editors and Kubernetes
/// replace files by rename) and reloads when the file changes. The watch
/// lasts as long as the returned guard.
pub(crate) fn watch(state: Arc<AdminState>, path: &Path) -> notify::Result<impl Drop + Send> {
    let file: PathBuf = path.file_name().map(PathBuf::from).unwrap_or_default();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut debouncer = new_debouncer(DEBOUNCE, None, move |result: DebounceEventResult| {
        let Ok(events) = result else { return };
        // Kubernetes swaps a mounted ConfigMap by renaming its `..data` link.
        let ours = |p: &Path| {
            p.file_name()
                .is_some_and(|n| n == file.as_os_str() || n == "..data")
        };
        let touched = events
            .iter()
            .any(|e| !e.kind.is_access() && e.paths.iter().any(|p| ours(p)));
        if touched {
            // A reload already queued will read the newest file.
            let _ = tx.try_send(());
        }
    })?;
    debouncer.watch(&dir, RecursiveMode::NonRecursive)?;
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            let _ = from_file(&state, "file").await;
        }
    });
    Ok(debouncer)
}

/// `POST /api/reload`: reloads now (admin token required).
pub(crate) async fn post(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if let Err(refusal) = access::admin(&state, &headers) {
        return refusal;
    }
    let result = from_file(&state, "api").await;
    let status = match result {
        Ok(()) => StatusCode::OK,
        Err(_) if state.config_path.is_none() => StatusCode::CONFLICT,
        Err(_) => StatusCode::UNPROCESSABLE_ENTITY,
    };
    json_response(status, &report(&state))
}

/// `GET /api/reload`: the last reload's outcome (admin token once one is configured).
pub(crate) async fn get(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if let Err(refusal) = access::reader(&state, &headers) {
        return refusal;
    }
    json_response(StatusCode::OK, &report(&state))
}

fn report(state: &AdminState) -> serde_json::Value {
    let s = state
        .reload_status
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    json!({
        "ok": s.ok,
        "at": s.at_ms.map(|ms| crate::util::time::iso8601(ms as i64)),
        "trigger": s.trigger,
        "error": s.error,
        "applied": s.applied,
        "refused": s.refused,
        "config": state.config_path.as_ref().map(|p| p.display().to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pins::Pins;

    fn config(b_timeout: &str) -> Config {
        let text = format!(
            "[servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\n\
             [servers.b]\nurl = \"http://127.0.0.1:2/mcp\"\ntimeout = \"{b_timeout}\"\n\
             [pins]\ndatabase = \":memory:\"\n[audit]\ndatabase = \":memory:\"\n"
        );
        config::load_str(&text, "t.toml", &|_| None).expect("config")
    }

    #[test]
    fn only_changed_servers_get_new_state() {
        crate::app::install_crypto_provider();
        let pins = Pins::open(None, "t.toml").expect("pins");
        let first = config("5s");
        let state = AppState::new(
            Arc::new(first),
            pins,
            Arc::default(),
            Arc::new(crate::telemetry::Traces::off()),
            true,
        )
        .expect("state");
        let before = state.live.load_full();
        apply(&state, config("7s")).expect("applied");
        let after = state.live.load_full();
        assert!(Arc::ptr_eq(&before.servers["a"], &after.servers["a"]));
        assert!(!Arc::ptr_eq(&before.servers["b"], &after.servers["b"]));
        assert!(!Arc::ptr_eq(&before.config, &after.config));
    }

    #[test]
    fn a_moved_span_exporter_is_refused() {
        let old = config("5s");
        let mut new = config("5s");
        new.telemetry.otlp_endpoint = reqwest::Url::parse("http://127.0.0.1:4318").ok();
        let refused = fixed(&old, &new).expect_err("refused");
        assert!(refused.contains("telemetry.otlp_endpoint"), "{refused}");
        assert!(fixed(&old, &config("9s")).is_ok());
    }

    #[test]
    fn a_moved_listener_is_refused_and_nothing_changes() {
        crate::app::install_crypto_provider();
        let pins = Pins::open(None, "t.toml").expect("pins");
        let first = config("5s");
        let state = AppState::new(
            Arc::new(first),
            pins,
            Arc::default(),
            Arc::new(crate::telemetry::Traces::off()),
            true,
        )
        .expect("state");
        let before = state.live.load_full();
        let mut moved = config("7s");
        moved.gateway.admin_listen = "127.0.0.1:9999".parse().expect("addr");
        let refusal = apply(&state, moved).expect_err("refused");
        assert!(refusal.contains("gateway.admin_listen"), "{refusal}");
        assert!(Arc::ptr_eq(&before, &state.live.load_full()));
    }
}
