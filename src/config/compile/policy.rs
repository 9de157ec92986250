//! `[[rules]]` → the [`Policy`], and `[rate_limit]` → its settings: each
//! rule's clients, servers, tools, resources, prompts, rate and argument
//! schema.
//!
//! Invariants: every name a rule references exists; every pattern compiles;
//! the first fault stops compilation with its place in the file.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::Arc;

use toml::Spanned;

use super::super::model::ServerSettings;
use super::super::raw::{RawConfig, RawRule};
use crate::policy::expression::Expression;
use crate::policy::glob::Glob;
use crate::policy::{Action, Kind, Policy, Rate, RateKey, Rule};
use crate::ratelimit::{OnBackendError, RateBackend, RateLimitSettings};
use crate::validate::{CompiledSchema, SchemaLimits};

use super::{Ctx, Result};

impl Ctx<'_> {
    pub(super) fn policy(
        &self,
        rules: &[RawRule],
        clients: &BTreeSet<String>,
        servers: &BTreeMap<String, Arc<ServerSettings>>,
        flow_sources: &BTreeSet<crate::flow::Label>,
    ) -> Result<Policy> {
        let server_names: BTreeSet<String> = servers.keys().cloned().collect();
        let mut compiled = Vec::new();
        for (i, raw) in rules.iter().enumerate() {
            let key = format!("rules[{i}]");
            let action = self.one_of(
                Some(&raw.action),
                &format!("{key}.action"),
                &[("allow", Action::Allow), ("deny", Action::Deny)],
                Action::Allow,
            )?;
            let clients =
                self.references(&raw.clients, &format!("{key}.clients"), clients, "clients")?;
            let servers = self.references(
                &raw.servers,
                &format!("{key}.servers"),
                &server_names,
                "servers",
            )?;
            let tools = self.globs(raw.tools.as_deref(), &format!("{key}.tools"))?;
            let resources =
                self.resource_globs(raw.resources.as_deref(), &format!("{key}.resources"))?;
            let prompts = self.globs(raw.prompts.as_deref(), &format!("{key}.prompts"))?;
            if tools.is_empty() && resources.is_empty() && prompts.is_empty() {
                return Err(self.fail(
                    Some(raw.action.span()),
                    &key,
                    "the rule names nothing to allow or deny; give at least one of `tools`, `resources` or `prompts` (use [\"*\"] for all)",
                ));
            }
            let rate = match &raw.rate {
                None => None,
                Some(_) if action == Action::Deny => {
                    return Err(self.fail(raw.rate.as_ref().map(Spanned::span), &format!("{key}.rate"), "a deny rule refuses every call it matches, so a `rate` on it would never apply"));
                }
                Some(rate) => Some(self.rate(rate, &format!("{key}.rate"))?),
            };
            let arguments = match &raw.arguments {
                None => None,
                Some(a) if action == Action::Deny || tools.is_empty() => {
                    return Err(self.fail(Some(a.span()), &format!("{key}.arguments"), "`arguments` constrains the tools an allow rule lets through; it needs `action = \"allow\"` and `tools`"));
                }
                Some(a) => Some(self.arguments(a, &format!("{key}.arguments"))?),
            };
            let approval = match &raw.approval {
                None => None,
                Some(a) if action == Action::Deny || tools.is_empty() => {
                    return Err(self.fail(Some(a.span()), &format!("{key}.approval"), "`approval` makes a person approve the tool calls an allow rule lets through; it needs `action = \"allow\"` and `tools`"));
                }
                Some(a) => Some(self.approval(a, &format!("{key}.approval"), i)?),
            };
            let when = match &raw.when {
                None => None,
                Some(w) => {
                    // A condition reads what one kind of use has: the rule names one kind.
                    let kind = match (tools.is_empty(), resources.is_empty(), prompts.is_empty()) {
                        (false, true, true) => Kind::Tool,
                        (true, false, true) => Kind::Resource,
                        (true, true, false) => Kind::Prompt,
                        _ => {
                            return Err(self.fail(Some(w.span()), &format!("{key}.when"), "a condition reads what one kind of use has (a tool call's arguments and annotations, a resource's `uri`, a prompt's name and arguments), and this rule names more than one of `tools`, `resources` and `prompts`; split it into one rule per kind, each with its own `when`"));
                        }
                    };
                    Some(
                        Expression::compile_for(w.get_ref(), kind)
                            .map_err(|e| self.fail(Some(w.span()), &format!("{key}.when"), e))?,
                    )
                }
            };
            let allow_with_tools = action == Action::Allow && !tools.is_empty();
            let flow = self.flow_rule(raw, &key, allow_with_tools, flow_sources)?;
            compiled.push(Rule {
                index: i,
                when,
                flow,
                approval,
                clients,
                servers,
                tools,
                resources,
                prompts,
                action,
                rate,
                arguments,
            });
        }
        Ok(Policy::new(compiled))
    }

    pub(super) fn references(
        &self,
        list: &Spanned<Vec<Spanned<String>>>,
        key: &str,
        defined: &BTreeSet<String>,
        table: &str,
    ) -> Result<Vec<Glob>> {
        if list.get_ref().is_empty() {
            return Err(self.fail(
                Some(list.span()),
                key,
                format!(
                    "the list is empty, so the rule can never match; name {table} or use [\"*\"]"
                ),
            ));
        }
        let mut out = Vec::new();
        for (j, item) in list.get_ref().iter().enumerate() {
            let k = format!("{key}[{j}]");
            let glob = Glob::new(item.get_ref()).map_err(|e| {
                self.fail(Some(item.span()), &k, format!("not a valid pattern: {e}"))
            })?;
            if glob.is_literal() && !defined.contains(item.get_ref()) {
                let known: Vec<&str> = defined.iter().map(String::as_str).collect();
                let singular = table.trim_end_matches('s');
                return Err(self.fail(
                    Some(item.span()),
                    &k,
                    format!(
                        "no {singular} named {:?} is defined; defined {table}: {} (or use a pattern such as \"*\")",
                        item.get_ref(),
                        if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                    ),
                ));
            }
            out.push(glob);
        }
        Ok(out)
    }

    pub(super) fn globs(&self, list: Option<&[Spanned<String>]>, key: &str) -> Result<Vec<Glob>> {
        let items = list.unwrap_or_default().iter().enumerate();
        items
            .map(|(j, item)| self.glob(item, &format!("{key}[{j}]")))
            .collect()
    }

    /// One pattern, at `key`.
    pub(super) fn glob(&self, item: &Spanned<String>, key: &str) -> Result<Glob> {
        Glob::new(item.get_ref())
            .map_err(|e| self.fail(Some(item.span()), key, format!("not a valid pattern: {e}")))
    }

    /// Resource patterns are matched against canonical URIs only
    /// ([`crate::policy::uri`]): a pattern spelled otherwise could never match
    /// what it seems to name, so it is refused with the spelling to write.
    fn resource_globs(&self, list: Option<&[Spanned<String>]>, key: &str) -> Result<Vec<Glob>> {
        let items = list.unwrap_or_default().iter().enumerate();
        items
            .map(|(j, item)| self.resource_glob(item, &format!("{key}[{j}]")))
            .collect()
    }

    /// One resource pattern, at `key` (see [`Self::resource_globs`]).
    pub(super) fn resource_glob(&self, item: &Spanned<String>, key: &str) -> Result<Glob> {
        let written = item.get_ref();
        let reason = match crate::policy::uri::pattern(written) {
            Ok(canonical) if canonical == *written => return self.glob(item, key),
            Ok(canonical) => format!(
                "resource URIs are matched in their canonical form (lowercase scheme and host, \
                 unreserved characters unencoded, other escapes in uppercase hex, no empty segments); \
                 write {canonical:?}"
            ),
            Err(why) => format!("this resource pattern can never match a canonical URI: {why}"),
        };
        Err(self.fail(Some(item.span()), key, reason))
    }

    pub(super) fn rate(
        &self,
        rate: &Spanned<super::super::raw::RawRate>,
        key: &str,
    ) -> Result<Rate> {
        let raw = rate.get_ref();
        let burst = u32::try_from(*raw.burst.get_ref())
            .ok()
            .and_then(NonZeroU32::new)
            .filter(|b| b.get() <= 1_000_000_000)
            .ok_or_else(|| {
                self.fail(
                    Some(raw.burst.span()),
                    &format!("{key}.burst"),
                    "expected a whole number of calls from 1 to 1000000000",
                )
            })?;
        let per_second = *raw.per_second.get_ref();
        if !(per_second.is_finite() && per_second > 0.0 && per_second <= 1e9) {
            return Err(self.fail(
                Some(raw.per_second.span()),
                &format!("{key}.per_second"),
                "expected a number of calls per second above 0 (e.g. 0.5 for one call every 2 s)",
            ));
        }
        let key_kind = self.one_of(
            raw.key.as_ref(),
            &format!("{key}.key"),
            &[
                ("client", RateKey::Client),
                ("client+tool", RateKey::ClientTool),
                ("all", RateKey::All),
            ],
            RateKey::Client,
        )?;
        // The buckets' arithmetic is exact up to a refill time of 100 years.
        let refill_secs = f64::from(burst.get()) / per_second;
        if refill_secs > crate::ratelimit::gcra::MAX_REFILL as f64 / 1e9 {
            return Err(self.fail(
                Some(rate.span()),
                key,
                format!(
                    "an empty bucket would take {:.0} years to fill (burst / per_second); at most 100 years is supported",
                    refill_secs / (365.0 * 86_400.0)
                ),
            ));
        }
        Ok(Rate {
            burst,
            per_second,
            key: key_kind,
        })
    }

    pub(super) fn arguments(
        &self,
        value: &Spanned<toml::Value>,
        key: &str,
    ) -> Result<CompiledSchema> {
        let json = serde_json::to_value(value.get_ref()).map_err(|e| {
            self.fail(
                Some(value.span()),
                key,
                format!("cannot be read as JSON Schema: {e}"),
            )
        })?;
        let json = if json.get("type").is_none() {
            let mut j = json;
            if let Some(map) = j.as_object_mut() {
                map.insert("type".into(), "object".into());
            }
            j
        } else {
            json
        };
        CompiledSchema::compile(&json, SchemaLimits::default()).map_err(|e| {
            self.fail(
                Some(value.span()),
                key,
                format!("expected a JSON Schema for the call's arguments: {e}"),
            )
        })
    }

    pub(super) fn rate_limit(&self, raw: &RawConfig, namespace: &str) -> Result<RateLimitSettings> {
        let r = &raw.rate_limit;
        let redis = self.one_of(
            r.backend.as_ref(),
            "rate_limit.backend",
            &[("memory", false), ("redis", true)],
            false,
        )?;
        // Without a URL of its own, the deployment's one (`[state] redis_url`).
        let url = match self.redis_url(r.redis_url.as_ref(), "rate_limit.redis_url")? {
            Some(url) => Some(url),
            None => self.redis_url(raw.state.redis_url.as_ref(), "state.redis_url")?,
        };
        let backend = match (redis, url) {
            (true, Some(url)) => RateBackend::Redis(url),
            (true, None) => {
                return Err(self.fail(
                    r.backend.as_ref().map(Spanned::span),
                    "rate_limit.redis_url",
                    "the redis backend needs `redis_url` here or in `[state]`, e.g. \"redis://127.0.0.1:6379\"",
                ));
            }
            (false, _) => RateBackend::Memory,
        };
        Ok(RateLimitSettings {
            backend,
            on_backend_error: self.one_of(
                r.on_backend_error.as_ref(),
                "rate_limit.on_backend_error",
                &[
                    ("deny", OnBackendError::Deny),
                    ("allow", OnBackendError::Allow),
                ],
                OnBackendError::Deny,
            )?,
            // The deployment's, as the state store's keys.
            namespace: namespace.to_owned(),
        })
    }
}
