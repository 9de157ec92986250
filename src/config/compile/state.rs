//! `[state]` → [`crate::state::StateSettings`], and how it ties to
//! `[rate_limit]` and `[approvals]`.
//!
//! Invariants: one Redis URL serves the deployment (`[rate_limit] backend =
//! "redis"` without a `redis_url` of its own uses `[state]`'s); the Redis
//! backend is refused without `[approvals] key`: a generated key is per
//! process, so every other replica would refuse the states one signs.

use toml::Spanned;

use super::super::raw::RawConfig;
use super::{Ctx, Result};
use crate::state::settings::{DEFAULT_NAMESPACE, MAX_NAMESPACE, valid_namespace};
use crate::state::{StateBackend, StateSettings};

impl Ctx<'_> {
    pub(super) fn state(&self, raw: &RawConfig) -> Result<StateSettings> {
        let s = &raw.state;
        let redis = self.one_of(
            s.backend.as_ref(),
            "state.backend",
            &[("memory", false), ("redis", true)],
            false,
        )?;
        let url = self.redis_url(s.redis_url.as_ref(), "state.redis_url")?;
        let namespace = match &s.namespace {
            None => DEFAULT_NAMESPACE.to_owned(),
            Some(n) if valid_namespace(n.get_ref()) => n.get_ref().clone(),
            Some(n) => {
                return Err(self.fail(
                    Some(n.span()),
                    "state.namespace",
                    format!(
                        "expected 1 to {MAX_NAMESPACE} characters of a-z, 0-9, `_` and `-` (the deployment's name in \
                         every Redis key, `portcullis:<namespace>:…`)"
                    ),
                ));
            }
        };
        let backend = match (redis, url) {
            (false, _) => StateBackend::Memory,
            (true, None) => {
                return Err(self.fail(
                    s.backend.as_ref().map(Spanned::span),
                    "state.redis_url",
                    "the redis backend needs `redis_url`, e.g. \"redis://127.0.0.1:6379\"",
                ));
            }
            (true, Some(url)) => {
                if raw.approvals.key.is_none() {
                    return Err(self.fail(
                        s.backend.as_ref().map(Spanned::span),
                        "state.backend",
                        "the redis backend needs `[approvals] key`, the same on every replica (e.g. \
                         `key = \"${PORTCULLIS_APPROVAL_KEY}\"` from `openssl rand -hex 32`): without it each \
                         replica generates its own, and every other replica refuses the requestStates it signs",
                    ));
                }
                StateBackend::Redis(url)
            }
        };
        Ok(StateSettings { backend, namespace })
    }

    /// A `redis://` or `rediss://` URL (`${NAME}` expanded), checked even
    /// when unused so a later switch of backend cannot surprise.
    pub(super) fn redis_url(
        &self,
        value: Option<&Spanned<String>>,
        key: &str,
    ) -> Result<Option<String>> {
        let Some(url) = value else {
            return Ok(None);
        };
        let text = self.expand(url, key)?;
        if !(text.starts_with("redis://") || text.starts_with("rediss://")) {
            return Err(self.fail(
                Some(url.span()),
                key,
                "expected a redis:// or rediss:// URL",
            ));
        }
        Ok(Some(text))
    }
}
