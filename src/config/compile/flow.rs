//! `[servers.NAME.labels]` → the [`FlowSettings`], and a rule's `flow = {
//! holds, then }` → its [`FlowRule`].
//!
//! Invariants: a label or sink is one the gateway knows; a flow rule names
//! at least one label, only labels some tool sets (else it could never act),
//! and `then = "approval"` comes with the rule's `approval`.

use std::collections::{BTreeMap, BTreeSet};

use super::super::raw::{RawConfig, RawFlow, RawRule};
use super::{Ctx, Result};
use crate::flow::{FlowRule, FlowSettings, Label, Sink, Then, ToolLabels};

impl Ctx<'_> {
    pub(super) fn flow_labels(&self, raw: &RawConfig) -> Result<FlowSettings> {
        let mut labels = BTreeMap::new();
        for (server, raw_server) in &raw.servers {
            let mut tools = BTreeMap::new();
            for (tool, spec) in &raw_server.labels {
                let key = format!("servers.{}.labels.{}", server.get_ref(), tool.get_ref());
                let spec_ref = spec.get_ref();
                let source = spec_ref
                    .source
                    .as_ref()
                    .map(|s| {
                        self.one_of(
                            Some(s),
                            &format!("{key}.source"),
                            &Label::ALL,
                            Label::Private,
                        )
                    })
                    .transpose()?;
                let sink = spec_ref
                    .sink
                    .as_ref()
                    .map(|s| {
                        self.one_of(
                            Some(s),
                            &format!("{key}.sink"),
                            &[("egress", Sink::Egress)],
                            Sink::Egress,
                        )
                    })
                    .transpose()?;
                if source.is_none() && sink.is_none() {
                    return Err(self.fail(
                        Some(spec.span()),
                        &key,
                        "the tool is given no label; write `source = \"private\"` or `\"untrusted\"`, and/or `sink = \"egress\"`",
                    ));
                }
                tools.insert(tool.get_ref().clone(), ToolLabels { source, sink });
            }
            if !tools.is_empty() {
                labels.insert(server.get_ref().clone(), tools);
            }
        }
        Ok(FlowSettings { labels })
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
                return Err(self.fail(Some(item.span()), &k, format!("no tool is labelled `source = \"{label}\"` in any [servers.NAME.labels], so this rule could never act; label the tools that read such data")));
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
