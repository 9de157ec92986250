//! The flow rules among the rules that decided a call.
//!
//! Place: read by the proxy's call check after the access decision; the
//! labels a session holds come from the flow store, not from here.

use super::{Decision, Policy};
use crate::approval::Requirement;
use crate::flow::FlowRule;

/// One matching allow rule's `flow`, with the rule (`rules[N]`) and its approval.
#[derive(Debug, Clone, Copy)]
pub struct FlowOf<'p> {
    pub rule: usize,
    pub flow: &'p FlowRule,
    pub approval: Option<&'p Requirement>,
}

impl Policy {
    /// The `flow` of every allow rule in `decision`, in file order.
    pub fn flows<'p>(&'p self, decision: &'p Decision) -> impl Iterator<Item = FlowOf<'p>> + 'p {
        let allowed = if decision.allowed {
            &decision.allow_rules[..]
        } else {
            &[]
        };
        allowed.iter().filter_map(|i| {
            let rule = &self.rules[*i];
            rule.flow.as_ref().map(|flow| FlowOf {
                rule: rule.index,
                flow,
                approval: rule.approval.as_ref(),
            })
        })
    }

    /// The strictest of `requirements` (operator over either over user, the
    /// first among equals), as among the rules' own approvals.
    pub(crate) fn strictest_approval<'r>(
        &self,
        requirements: impl IntoIterator<Item = &'r Requirement>,
    ) -> Option<&'r Requirement> {
        super::resolve::strictest(requirements)
    }
}
