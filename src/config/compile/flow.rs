//! `[servers.NAME.labels]`, `labels_from_annotations`, `resource_labels`
//! and `prompt_labels` → the [`FlowSettings`], and a rule's `flow = {
//! holds, then }` → its [`FlowRule`].
//!
//! Invariants: a label or sink is one the gateway knows; only tools are
//! sinks; a resource pattern is written in canonical form; a flow rule names
//! at least one label, only labels some tool sets (else it could never act),
//! and `then = "approval"` comes with the rule's `approval`.

use std::collections::{BTreeMap, BTreeSet};

use toml::Spanned;

use super::super::raw::{RawConfig, RawFlow, RawLabels, RawRule};
use super::{Ctx, Result};
use crate::flow::{FlowRule, FlowSettings, Label, Labelled, Sink, Then, ToolLabels};

impl Ctx<'_> {
    pub(super) fn flow_labels(&self, raw: &RawConfig) -> Result<FlowSettings> {
        let mut settings = FlowSettings::default();
        for (server, raw_server) in &raw.servers {
            let name = server.get_ref();
            let trusted = raw_server
                .labels_from_annotations
                .as_ref()
                .is_some_and(|t| *t.get_ref());
            if trusted {
                settings.from_annotations.insert(name.clone());
            }
            let mut tools = BTreeMap::new();
            for (tool, spec) in &raw_server.labels {
                let key = format!("servers.{name}.labels.{}", tool.get_ref());
                let (source, sink) = (self.source(spec, &key)?, self.sink(spec, &key)?);
                // Under trusted annotations, `{}` is how a tool is kept unlabelled.
                if source.is_none() && sink.is_none() && !trusted {
                    return Err(self.fail(
                        Some(spec.span()),
                        &key,
                        "the tool is given no label; write `source = \"private\"` or `\"untrusted\"`, and/or `sink = \"egress\"`",
                    ));
                }
                tools.insert(tool.get_ref().clone(), ToolLabels { source, sink });
            }
            if !tools.is_empty() {
                settings.labels.insert(name.clone(), tools);
            }
            let resources =
                self.named_labels(name, "resource_labels", &raw_server.resource_labels)?;
            if !resources.is_empty() {
                settings.resources.insert(name.clone(), resources);
            }
            let prompts = self.named_labels(name, "prompt_labels", &raw_server.prompt_labels)?;
            if !prompts.is_empty() {
                settings.prompts.insert(name.clone(), prompts);
            }
        }
        Ok(settings)
    }

    fn source(&self, spec: &Spanned<RawLabels>, key: &str) -> Result<Option<Label>> {
        (spec.get_ref().source.as_ref())
            .map(|s| {
                self.one_of(
                    Some(s),
                    &format!("{key}.source"),
                    &Label::ALL,
                    Label::Private,
                )
            })
            .transpose()
    }

    fn sink(&self, spec: &Spanned<RawLabels>, key: &str) -> Result<Option<Sink>> {
        (spec.get_ref().sink.as_ref())
            .map(|s| {
                let sinks = [("egress", Sink::Egress)];
                self.one_of(Some(s), &format!("{key}.sink"), &sinks, Sink::Egress)
            })
            .transpose()
    }

    /// `resource_labels` or `prompt_labels` of one server: each pattern (a
    /// resource's in canonical form) with its one source label.
    fn named_labels(
        &self,
        server: &str,
        table: &str,
        raw: &BTreeMap<Spanned<String>, Spanned<RawLabels>>,
    ) -> Result<Vec<Labelled>> {
        let mut out = Vec::new();
        for (pattern, spec) in raw {
            let key = format!("servers.{server}.{table}.{}", pattern.get_ref());
            if let Some(sink) = &spec.get_ref().sink {
                return Err(self.fail(Some(sink.span()), &format!("{key}.sink"), "only tools are sinks: reading a resource or getting a prompt sends nothing out; label the tool that can send data out in [servers.NAME.labels]"));
            }
            let Some(source) = self.source(spec, &key)? else {
                return Err(self.fail(
                    Some(spec.span()),
                    &key,
                    "give it a label: `source = \"private\"` or `\"untrusted\"`",
                ));
            };
            let pattern = if table == "resource_labels" {
                self.resource_glob(pattern, &key)?
            } else {
                self.glob(pattern, &key)?
            };
            out.push(Labelled { pattern, source });
        }
        Ok(out)
    }

    /// The `flow` of rule `key`, checked against the labels tools set.
    pub(super) fn flow_rule(
        &self,
        raw: &RawRule,
        key: &str,
        allow_with_tools: bool,
        set: &BTreeSet<Label>,
    ) -> Result<Option<FlowRule>> {
        let Some(flow) = &raw.flow else {
            return Ok(None);
        };
        let key = format!("{key}.flow");
        if !allow_with_tools {
            return Err(self.fail(Some(flow.span()), &key, "`flow` decides the tool calls an allow rule lets through; it needs `action = \"allow\"` and `tools`"));
        }
        let RawFlow { holds, then } = flow.get_ref();
        if holds.get_ref().is_empty() {
            return Err(self.fail(
                Some(holds.span()),
                &format!("{key}.holds"),
                "name the labels the session must hold, e.g. [\"private\", \"untrusted\"]",
            ));
        }
        let mut labels = Vec::new();
        for (j, item) in holds.get_ref().iter().enumerate() {
            let k = format!("{key}.holds[{j}]");
            let label = self.one_of(Some(item), &k, &Label::ALL, Label::Private)?;
            if !set.contains(&label) {
                return Err(self.fail(Some(item.span()), &k, format!("nothing is labelled `source = \"{label}\"` in any [servers.NAME.labels], resource_labels or prompt_labels (nor by trusted annotations), so this rule could never act; label the tools, resources or prompts that read such data")));
            }
            if !labels.contains(&label) {
                labels.push(label);
            }
        }
        let then = self.one_of(
            Some(then),
            &format!("{key}.then"),
            &[("deny", Then::Deny), ("approval", Then::Approval)],
            Then::Deny,
        )?;
        if then == Then::Approval && raw.approval.is_none() {
            return Err(self.fail(Some(flow.span()), &format!("{key}.then"), "`then = \"approval\"` asks a person with the rule's `approval`, which this rule lacks; add `approval = { by = \"user\" }` (or \"operator\", \"either\")"));
        }
        Ok(Some(FlowRule {
            holds: labels,
            then,
        }))
    }
}
