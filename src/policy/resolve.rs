//! One resolution of every rule that matches a use: what a call gets.
//!
//! Place in the path: inside the policy decision. The runtime's call check,
//! `portcullis check` (its per-pattern view and `--explain`) and the
//! dashboard's policy view all read a use through [`Policy::resolve`] and the
//! methods it is built from, so what the configuration says a call gets and
//! what the gateway does with it cannot drift apart.
//!
//! Invariants, when several allow rules match and no deny rule does: every
//! rate applies (a call takes a token from each bucket), every `arguments`
//! constraint applies (each must pass), and the strictest approval wins —
//! operator over either over user, the first in file order among equals. A
//! matching deny rule ends the resolution: nothing else applies.

use crate::approval::settings::{Approver, Requirement};
use crate::auth::ClientId;

use super::{Decision, Effective, ExpressionFailed, Facts, Outcome, Policy, Subject};

/// How strict an approver is: an operator is the strictest (the client's own
/// user cannot say yes), then either, then the user alone.
pub(crate) fn strictness(by: Approver) -> u8 {
    match by {
        Approver::User => 1,
        Approver::Either => 2,
        Approver::Operator => 3,
    }
}

/// The strictest of `requirements` (in file order): the first among equals.
pub(crate) fn strictest<'r>(
    requirements: impl IntoIterator<Item = &'r Requirement>,
) -> Option<&'r Requirement> {
    let mut best: Option<&Requirement> = None;
    for r in requirements {
        if best.is_none_or(|b| strictness(r.by) > strictness(b.by)) {
            best = Some(r);
        }
    }
    best
}

// === impl Policy ===

impl Policy {
    /// Resolves every rule that matches `client` using `subject` on `server`.
    pub fn resolve(&self, client: &ClientId, server: &str, subject: Subject<'_>) -> Effective<'_> {
        let decision = self.decide(client, server, subject);
        self.effective(decision, subject)
    }

    /// Resolves a tool call with its call-time `facts`, as the runtime does:
    /// every matching rule's `when` is evaluated and told to `seen`; one that
    /// fails denies the call.
    pub fn resolve_call(
        &self,
        client: &ClientId,
        server: &str,
        tool: &str,
        facts: &Facts<'_>,
        seen: &mut dyn FnMut(usize, &Outcome),
    ) -> Result<Effective<'_>, ExpressionFailed> {
        self.resolve_use(client, server, Subject::Tool(tool), facts, seen)
    }

    /// Resolves a use of `subject` with its `facts` (see [`Self::resolve_call`]).
    pub fn resolve_use(
        &self,
        client: &ClientId,
        server: &str,
        subject: Subject<'_>,
        facts: &Facts<'_>,
        seen: &mut dyn FnMut(usize, &Outcome),
    ) -> Result<Effective<'_>, ExpressionFailed> {
        let decision = self.decide_with(client, server, subject, Some(facts), seen)?;
        Ok(self.effective(decision, subject))
    }

    fn effective(&self, decision: Decision, subject: Subject<'_>) -> Effective<'_> {
        let rates = self.rates(&decision.allow_rules).collect();
        let constraints = match subject {
            Subject::Tool(_) => decision
                .allow_rules
                .iter()
                .filter(|i| self.rules[**i].arguments.is_some())
                .map(|i| self.rules[*i].index)
                .collect(),
            _ => Vec::new(),
        };
        let approval = match subject {
            Subject::Tool(_) => self.approval(&decision),
            _ => None,
        };
        Effective {
            decision,
            rates,
            constraints,
            approval,
        }
    }
}

impl Policy {
    /// The approval a permitted call needs: the strictest among the matching
    /// allow rules that ask for one (operator over either over user, the first
    /// in file order among equals); any such rule makes the call need approval.
    pub(crate) fn approval(&self, decision: &Decision) -> Option<&crate::approval::Requirement> {
        if !decision.allowed {
            return None;
        }
        strictest(
            decision
                .allow_rules
                .iter()
                .map(|i| &self.rules[*i])
                // A flow rule's approval is asked only once the session holds its labels.
                .filter(|r| {
                    !r.flow
                        .as_ref()
                        .is_some_and(|f| f.then == crate::flow::Then::Approval)
                })
                .filter_map(|r| r.approval.as_ref()),
        )
    }

    /// Checks `arguments` against the `arguments` constraint of rule `index`
    /// (as shown `rules[N]`) alone; a rule without one passes.
    pub fn check_rule_arguments(
        &self,
        index: usize,
        arguments: &serde_json::Value,
    ) -> Result<(), Vec<crate::validate::Violation>> {
        match self
            .rules
            .iter()
            .find(|r| r.index == index)
            .and_then(|r| r.arguments.as_ref())
        {
            Some(schema) => schema.check(arguments),
            None => Ok(()),
        }
    }
}
