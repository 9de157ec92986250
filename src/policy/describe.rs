//! The effective policy as text: what `portcullis check` prints and the
//! dashboard's policy view shows.
//!
//! Place: beside the decision, read by the configuration's description. The
//! per-pattern part ("what a use gets") folds the matching rules with the
//! same rules as [`Policy::resolve`]: every rate and `arguments` constraint
//! of a matching allow rule applies, the strictest approval wins, a deny
//! overrides. A rule whose pattern only overlaps the one shown applies "if
//! the name also matches" its pattern.
//!
//! Invariant: nothing here decides; every line is derived from the compiled
//! rules, so the text cannot promise what a call would not get.

use std::fmt::Write as _;

use super::Policy;
use super::glob::Glob;
use super::resolve::strictness;
use super::rule::{Action, Rule, client_matches};
use crate::auth::ClientId;

/// One rule that reaches a pattern: always, or only for the names that also
/// match the rule's own pattern.
struct Reach<'r> {
    rule: &'r Rule,
    /// `None`: the rule covers every name of the pattern.
    only_if: Option<&'r Glob>,
}

impl Reach<'_> {
    fn suffix(&self) -> String {
        match self.only_if {
            None => format!(" (rules[{}])", self.rule.index),
            Some(g) => format!(
                ", if the name also matches {} (rules[{}])",
                g.as_str(),
                self.rule.index
            ),
        }
    }
}

type GlobsOf = fn(&Rule) -> &Vec<Glob>;

const KINDS: [(&str, GlobsOf); 3] = [
    ("tool", |r| &r.tools),
    ("resource", |r| &r.resources),
    ("prompt", |r| &r.prompts),
];

// === impl Policy ===

impl Policy {
    /// The effective policy as text, per client and server: what `portcullis check` prints.
    pub(crate) fn describe(&self, clients: &[ClientId], servers: &[&str]) -> String {
        let mut out = String::new();
        for client in clients {
            let _ = writeln!(out, "client {}", client.name());
            let mut any = false;
            for server in servers {
                let lines = self.describe_one(client, server);
                if lines.is_empty() {
                    continue;
                }
                any = true;
                let _ = writeln!(out, "  server {server}");
                for line in lines {
                    let _ = writeln!(out, "    {line}");
                }
            }
            if !any {
                let _ = writeln!(out, "  nothing: no allow rule names this client");
            }
        }
        out
    }

    /// The rules that name `client` on `server`, in file order.
    fn applying<'p>(&'p self, client: &ClientId, server: &str) -> Vec<&'p Rule> {
        self.rules
            .iter()
            .filter(|r| {
                r.clients.iter().any(|g| client_matches(g, client))
                    && r.servers.iter().any(|g| g.matches(server))
            })
            .collect()
    }

    fn describe_one(&self, client: &ClientId, server: &str) -> Vec<String> {
        let rules = self.applying(client, server);
        let mut lines = Vec::new();
        for rule in &rules {
            let verb = match rule.action {
                Action::Allow => "allow",
                Action::Deny => "deny ",
            };
            for (kind, globs_of) in KINDS {
                let globs = globs_of(rule);
                if globs.is_empty() {
                    continue;
                }
                let names: Vec<&str> = globs.iter().map(Glob::as_str).collect();
                let mut line = format!("{verb} {:<9} {}", format!("{kind}s"), names.join(", "));
                if let Some(rate) = rule.rate {
                    let _ = write!(line, "  rate: {}", rate.describe());
                }
                if kind == "tool" && rule.arguments.is_some() {
                    line.push_str("  arguments constrained");
                }
                match (&rule.flow, &rule.approval, kind) {
                    (Some(flow), _, "tool") => {
                        let _ = write!(line, "  {}", flow_text(flow, rule));
                    }
                    (None, Some(approval), "tool") => {
                        let _ = write!(line, "  approval: {}", approval.describe());
                    }
                    _ => {}
                }
                if let Some(when) = &rule.when {
                    let _ = write!(line, "  when {:?}", when.source());
                }
                let _ = write!(line, "  (rules[{}])", rule.index);
                lines.push(line);
            }
        }
        if !lines.is_empty() && !lines.iter().any(|l| l.starts_with("allow")) {
            lines.push("(nothing is allowed here: only deny rules match)".to_owned());
        }
        for (kind, globs_of) in KINDS {
            lines.extend(uses(&rules, kind, globs_of));
        }
        lines
    }
}

/// Each allowed pattern of `kind` with everything a use of it gets: every
/// rate (a call takes a token from each), every `arguments` constraint, the
/// strictest approval, and the deny rules that take names of it away.
/// Nothing when the allow rules here add nothing to a plain allow.
fn uses(rules: &[&Rule], kind: &str, globs_of: GlobsOf) -> Vec<String> {
    let allows: Vec<&Rule> = rules
        .iter()
        .copied()
        .filter(|r| r.action == Action::Allow)
        .collect();
    let tool = kind == "tool";
    let adds = |r: &Rule| {
        r.rate.is_some()
            || (tool && (r.arguments.is_some() || r.approval.is_some() || r.flow.is_some()))
    };
    let patterns = distinct(allows.iter().flat_map(|r| globs_of(r)));
    if patterns.is_empty() || !allows.iter().any(|r| adds(r) && !globs_of(r).is_empty()) {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "what a use of each {kind} gets (every matching allow rule applies; the strictest approval wins; a deny overrides):"
    )];
    let width = patterns.iter().map(|p| p.as_str().len()).max().unwrap_or(0);
    for pattern in patterns {
        let reach: Vec<Reach<'_>> = rules
            .iter()
            .filter_map(|rule| {
                let globs = globs_of(rule);
                let hit = globs.iter().find(|g| g.overlaps(pattern))?;
                let covered = globs.iter().any(|g| g.covers(pattern));
                Some(Reach {
                    rule,
                    only_if: (!covered).then_some(hit),
                })
            })
            .collect();
        let mut items = Vec::new();
        for r in reach.iter().filter(|r| r.rule.action == Action::Deny) {
            items.push(format!("denied{}", r.suffix()));
        }
        let allowed: Vec<&Reach<'_>> = reach
            .iter()
            .filter(|r| r.rule.action == Action::Allow)
            .collect();
        for r in &allowed {
            if let Some(rate) = r.rule.rate {
                items.push(format!("rate {}{}", rate.describe(), r.suffix()));
            }
        }
        if tool {
            for r in allowed.iter().filter(|r| r.rule.arguments.is_some()) {
                items.push(format!("arguments constrained{}", r.suffix()));
            }
            // A flow rule's approval is asked only once its labels are held.
            let always: Vec<&Reach<'_>> = allowed
                .iter()
                .copied()
                .filter(|r| {
                    !r.rule
                        .flow
                        .as_ref()
                        .is_some_and(|f| f.then == crate::flow::Then::Approval)
                })
                .collect();
            items.extend(approvals(&always));
            for r in &allowed {
                if let Some(flow) = &r.rule.flow {
                    items.push(format!("{}{}", flow_text(flow, r.rule), r.suffix()));
                }
            }
        }
        if items.is_empty() {
            items.push("allowed, nothing more".to_owned());
        }
        for (i, item) in items.iter().enumerate() {
            let name = if i == 0 { pattern.as_str() } else { "" };
            let plus = if i == 0 { "" } else { "+ " };
            lines.push(format!("  {name:<width$}  {plus}{item}"));
        }
    }
    lines
}

/// `flow: calls to egress tools refused once the session holds private + untrusted`.
fn flow_text(flow: &crate::flow::FlowRule, rule: &Rule) -> String {
    let holds: Vec<&str> = flow.holds.iter().map(|l| l.as_str()).collect();
    let then = match (flow.then, &rule.approval) {
        (crate::flow::Then::Approval, Some(a)) => format!("need approval {}", a.describe()),
        _ => "are refused".to_owned(),
    };
    format!(
        "flow: calls to egress tools {then} once the session holds {}",
        holds.join(" + ")
    )
}

/// The approval a use of the pattern needs: the strictest of the rules that
/// cover it, then each stricter one that applies only to some of its names.
fn approvals(allowed: &[&Reach<'_>]) -> Vec<String> {
    let always = allowed
        .iter()
        .filter(|r| r.only_if.is_none())
        .filter_map(|r| r.rule.approval.as_ref().map(|a| (r, a)))
        .fold(
            None,
            |best: Option<(&&Reach<'_>, &crate::approval::Requirement)>, (r, a)| match best {
                Some((_, b)) if strictness(a.by) <= strictness(b.by) => best,
                _ => Some((r, a)),
            },
        );
    let floor = always.map_or(0, |(_, a)| strictness(a.by));
    let mut out = Vec::new();
    if let Some((r, a)) = always {
        out.push(format!("approval {}{}", a.describe(), r.suffix()));
    }
    for r in allowed.iter().filter(|r| r.only_if.is_some()) {
        if let Some(a) = r
            .rule
            .approval
            .as_ref()
            .filter(|a| strictness(a.by) > floor)
        {
            out.push(format!("approval {}{}", a.describe(), r.suffix()));
        }
    }
    out
}

/// The patterns in first-seen order, each once.
fn distinct<'g>(globs: impl Iterator<Item = &'g Glob>) -> Vec<&'g Glob> {
    let mut out: Vec<&Glob> = Vec::new();
    for g in globs {
        if !out.iter().any(|p| p.as_str() == g.as_str()) {
            out.push(g);
        }
    }
    out
}
