//! A key set fetched from `jwks_url`: cached, refreshed in the background,
//! and fetched again when a token names a key it does not hold.
//!
//! Place: under verification, when `[auth.jwt]` names a URL; the verifier
//! asks it for the current keys.
//!
//! Invariants: fetched without redirects or proxies, with a timeout and a
//! size cap; a failed fetch keeps the keys held; an unknown `kid` triggers at
//! most one extra fetch per [`UNKNOWN_KID_COOLDOWN`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once, OnceLock, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::keys::KeySet;

/// The largest key set document read from `jwks_url`.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Longest wait for the key set URL, connection included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// At most one fetch per this long is caused by tokens naming an unknown `kid`.
pub(crate) const UNKNOWN_KID_COOLDOWN: Duration = Duration::from_secs(30);

/// While no key set has been fetched yet, requests retry the fetch at most this often.
const RETRY_FAILED_FETCH: Duration = Duration::from_secs(5);

/// A key set fetched from `jwks_url`, refreshed in the background.
#[derive(Debug)]
pub(super) struct RemoteKeys {
    pub(super) url: reqwest::Url,
    pub(super) refresh: Duration,
    pub(super) client: OnceLock<reqwest::Client>,
    pub(super) keys: ArcSwap<KeySet>,
    pub(super) loaded: AtomicBool,
    pub(super) fetches: tokio::sync::Mutex<FetchTimes>,
    pub(super) refresher: Once,
}

#[derive(Debug, Default)]
pub(super) struct FetchTimes {
    attempted: Option<Instant>,
    forced: Option<Instant>,
}

impl RemoteKeys {
    /// The key set in force: starts the refresher on first use, and fetches
    /// inline while nothing has been fetched yet (at most every few seconds).
    /// True beside it when this call fetched.
    pub(super) async fn current(self: &Arc<Self>) -> (Arc<KeySet>, bool) {
        self.refresher.call_once(|| {
            tokio::spawn(refresh(Arc::downgrade(self), self.refresh));
        });
        let mut fetched = false;
        if !self.loaded.load(Ordering::Acquire) {
            let mut times = self.fetches.lock().await;
            let due = times
                .attempted
                .is_none_or(|t| t.elapsed() >= RETRY_FAILED_FETCH);
            if !self.loaded.load(Ordering::Acquire) && due {
                times.attempted = Some(Instant::now());
                self.fetch().await;
                fetched = true;
            }
        }
        (self.keys.load_full(), fetched)
    }

    /// A token named a key the set lacks: fetch again, unless that was done
    /// less than [`UNKNOWN_KID_COOLDOWN`] ago. True when a fetch was made.
    pub(super) async fn fetch_for_unknown_key(&self) -> bool {
        let mut times = self.fetches.lock().await;
        if times
            .forced
            .is_some_and(|t| t.elapsed() < UNKNOWN_KID_COOLDOWN)
        {
            return false;
        }
        let now = Instant::now();
        times.forced = Some(now);
        times.attempted = Some(now);
        self.fetch().await;
        true
    }

    /// Fetches the key set and swaps it in; on any failure the previous set stays.
    async fn fetch(&self) {
        match self.download().await {
            Ok((set, skipped)) => {
                for why in &skipped {
                    tracing::warn!(url = %self.url, "key set: left out {why}");
                }
                if set.is_empty() {
                    tracing::warn!(url = %self.url, "the key set holds no usable key; keeping the previous one");
                    return;
                }
                tracing::debug!(url = %self.url, keys = set.len(), "key set fetched");
                self.keys.store(Arc::new(set));
                self.loaded.store(true, Ordering::Release);
            }
            Err(why) => {
                tracing::warn!(url = %self.url, "cannot fetch the key set: {why}; keeping the previous one");
            }
        }
    }

    async fn download(&self) -> Result<(KeySet, Vec<String>), String> {
        let client = match self.client.get() {
            Some(c) => c.clone(),
            None => {
                // Built on first use: by then the process has its TLS provider.
                let c = reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .no_proxy()
                    .timeout(FETCH_TIMEOUT)
                    .connect_timeout(FETCH_TIMEOUT)
                    .build()
                    .map_err(|e| e.to_string())?;
                self.client.get_or_init(|| c).clone()
            }
        };
        let mut response = client
            .get(self.url.clone())
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status() != http::StatusCode::OK {
            return Err(format!(
                "HTTP {} (redirects are not followed)",
                response.status()
            ));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
        {
            return Err(format!("the key set is larger than {MAX_JWKS_BYTES} bytes"));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("the key set is larger than {MAX_JWKS_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        KeySet::parse(&body)
    }
}

/// Refreshes the key set every `every` for as long as its configuration lives.
pub(super) async fn refresh(keys: Weak<RemoteKeys>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(keys) = keys.upgrade() else {
            return;
        };
        let mut times = keys.fetches.lock().await;
        times.attempted = Some(Instant::now());
        keys.fetch().await;
    }
}
