//! Access rules: who may use which tool, resource or prompt on which server.
//!
//! Place in the path: right after authentication. The same rules, walked the
//! same way, serve the lists (`tools/list`, `resources/list`, `prompts/list`
//! show only what the client may use: [`Policy::decide_listed`]) and the
//! calls (`tools/call`, `resources/read`, `prompts/get`), so a list can never
//! promise what a call refuses, nor hide what a call allows, except where a
//! rule's condition reads the call's arguments or the session's labels (the
//! item stays listed and the use decides). Every use on the request path is
//! decided with its facts ([`Policy::decide_use`]); the fact-less
//! [`Policy::decide`] serves `portcullis check` alone.
//!
//! Invariants: deny by default — a call is allowed only when an `allow` rule
//! matches and no `deny` rule does; a deny rule always wins; `"*"` in `clients`
//! means any *authenticated* client (the anonymous client must be named).

mod describe;
pub mod expression;
mod flow;
pub mod glob;
mod index;
mod resolve;
mod rule;
mod subject;
pub mod uri;

use serde_json::Value;

use crate::auth::ClientId;
use crate::validate::Violation;
pub use expression::{Facts, ListFacts, Outcome};
use glob::Glob;
use rule::client_matches;
pub(crate) use rule::{Action, Rule};
pub use rule::{Rate, RateKey};
pub use subject::{Kind, Subject};

/// All rules, in file order.
#[derive(Debug, Default)]
pub struct Policy {
    pub(crate) rules: Vec<Rule>,
    /// The rules by what they name; built with them.
    index: index::Index,
    /// What the rules' conditions read of the JSON variables: a decision
    /// converts nothing else.
    reads: expression::Reads,
}

/// The outcome for one (client, server, subject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the use is permitted.
    pub allowed: bool,
    /// Index in `[[rules]]` of the rule that decided: the first matching deny,
    /// else the first matching allow.
    pub rule: Option<usize>,
    /// Indexes of every matching allow rule (their rates and argument constraints apply).
    pub allow_rules: Vec<usize>,
}

/// A `when` expression that failed at call time: the call is denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpressionFailed {
    /// The rule's index in `[[rules]]`.
    pub rule: usize,
    /// The expression as written.
    pub expression: String,
    /// CEL's reason (an error, or the non-bool it yielded).
    pub reason: String,
}

/// Everything that applies to one use by one client on one server.
#[derive(Debug, Clone)]
pub struct Effective<'p> {
    /// Allowed or not, and by which rule.
    pub decision: Decision,
    /// Every rate of every matching allow rule, with the rule's index in
    /// `[[rules]]`: a call takes a token from each.
    pub rates: Vec<(usize, Rate)>,
    /// The `[[rules]]` index of every matching allow rule with an `arguments`
    /// constraint (tools only): each must pass.
    pub constraints: Vec<usize>,
    /// The strictest approval among the matching allow rules (tools only).
    pub approval: Option<&'p crate::approval::Requirement>,
}

// === impl Policy ===

impl Policy {
    /// The policy of `rules` (in file order), indexed.
    pub(crate) fn new(rules: Vec<Rule>) -> Self {
        let index = index::Index::new(&rules);
        let mut reads = expression::Reads::default();
        for when in rules.iter().filter_map(|r| r.when.as_ref()) {
            reads.merge(when.reads());
        }
        Self {
            rules,
            index,
            reads,
        }
    }

    /// Decides whether `client` may use `subject` on `server` knowing nothing
    /// of the use (`portcullis check` without a request): a rule whose `when`
    /// reads a call-time fact is left to the call (an allow rule counts as
    /// matching, a deny rule as not); an expression that fails denies.
    pub fn decide(&self, client: &ClientId, server: &str, subject: Subject<'_>) -> Decision {
        let scope = expression::Scope::new(client, server, subject, None, &self.reads);
        hidden_on_failure(self.decide_in(&scope, subject, &mut |_, _| ()))
    }

    /// Decides whether a list shows `subject` on `server` to `client`, with
    /// what the list knows of the uses it promises (`facts`: the client's
    /// claims, a tool's annotations; `method` reads the use the item promises
    /// — `tools/call`, `resources/read`, `prompts/get` —, `now` the time of
    /// the list). Every `when` that reads neither the arguments nor the
    /// session's labels is evaluated as the use would evaluate it; one that
    /// reads them is left to the use (an allow rule counts as matching, a
    /// deny rule as not), so the item stays listed whenever some use could be
    /// allowed. An expression that fails hides the item (fail closed), as the
    /// use it promises would be denied. Flow rules are not part of this
    /// decision: the labels a session holds change after the list, and the
    /// use checks them.
    pub fn decide_listed(
        &self,
        client: &ClientId,
        server: &str,
        subject: Subject<'_>,
        facts: &ListFacts<'_>,
    ) -> Decision {
        let scope = expression::Scope::listed(client, server, subject, facts, &self.reads);
        hidden_on_failure(self.decide_in(&scope, subject, &mut |_, _| ()))
    }

    /// Whether some rule's `when` reads the session's flow labels: a call
    /// then reads them from the state store before it is decided.
    pub fn reads_labels(&self) -> bool {
        self.rules
            .iter()
            .any(|r| r.when.as_ref().is_some_and(|w| w.reads_labels()))
    }

    /// Whether some rule's `when` on subjects of `kind` reads the session's
    /// flow labels (a rule with `when` names one kind): a use of that kind
    /// then reads them from the state store before it is decided; others do
    /// not ask the store.
    pub fn reads_labels_of(&self, kind: Kind) -> bool {
        self.rules.iter().any(|r| {
            let names = match kind {
                Kind::Tool => &r.tools,
                Kind::Resource => &r.resources,
                Kind::Prompt => &r.prompts,
            };
            !names.is_empty() && r.when.as_ref().is_some_and(|w| w.reads_labels())
        })
    }

    /// Whether a list's decision may change for the same client from one list
    /// to the next: some rule's `when` is evaluated at list time and reads the
    /// token's claims or the time. A list rendered once per client and
    /// configuration cannot then be served again.
    pub fn lists_vary(&self) -> bool {
        self.rules
            .iter()
            .any(|r| r.when.as_ref().is_some_and(|w| w.varies_per_list()))
    }

    /// Decides a tool call with its call-time `facts`: every `when` on a
    /// matching rule is evaluated; one that fails denies the call with the
    /// rule and CEL's reason.
    pub fn decide_call(
        &self,
        client: &ClientId,
        server: &str,
        tool: &str,
        facts: &Facts<'_>,
    ) -> Result<Decision, ExpressionFailed> {
        self.decide_use(client, server, Subject::Tool(tool), facts)
    }

    /// Decides a use of `subject` (a tool call, a resource read or
    /// subscription, a prompt get, a completion) with its `facts`: every
    /// `when` on a matching rule is evaluated; one that fails denies the use
    /// with the rule and CEL's reason.
    pub fn decide_use(
        &self,
        client: &ClientId,
        server: &str,
        subject: Subject<'_>,
        facts: &Facts<'_>,
    ) -> Result<Decision, ExpressionFailed> {
        self.decide_with(client, server, subject, Some(facts), &mut |_, _| ())
    }

    /// The decision, telling `seen` each matching rule's `when` outcome.
    pub(crate) fn decide_with(
        &self,
        client: &ClientId,
        server: &str,
        subject: Subject<'_>,
        facts: Option<&Facts<'_>>,
        seen: &mut dyn FnMut(usize, &Outcome),
    ) -> Result<Decision, ExpressionFailed> {
        let scope = expression::Scope::new(client, server, subject, facts, &self.reads);
        self.decide_in(&scope, subject, seen)
    }

    /// The decision in `scope` (who uses `subject` where, and what is known
    /// of the use): one scope and one CEL context for every condition.
    fn decide_in(
        &self,
        scope: &expression::Scope<'_>,
        subject: Subject<'_>,
        seen: &mut dyn FnMut(usize, &Outcome),
    ) -> Result<Decision, ExpressionFailed> {
        let (client, server) = (scope.client(), scope.server());
        let mut deny = None;
        let mut allow_rules = Vec::new();
        let (kind, name) = (subject.kind(), subject.name());
        // Only the rules that match at all are visited, in file order.
        let matching = self.index.matching(client, server, kind, name);
        debug_assert!(
            self.index
                .matching(client, server, kind, name)
                .eq((0..self.rules.len())
                    .filter(|i| self.rules[*i].matches(client, server, subject))),
            "the rule index and a scan of every rule disagree"
        );
        let mut context = None;
        for i in matching {
            let rule = &self.rules[i];
            if let Some(when) = &rule.when {
                let outcome = when.evaluate_in(scope, &mut context);
                seen(rule.index, &outcome);
                let applies = match (&outcome, rule.action) {
                    (Outcome::True, _) => true,
                    (Outcome::False, _) => false,
                    // A failure denies the use; in a list (where only an
                    // expression that reads neither the arguments nor the
                    // labels is evaluated, so the use fails alike) it hides
                    // the item.
                    (Outcome::Failed(why), _) => {
                        return Err(ExpressionFailed {
                            rule: rule.index,
                            expression: when.source().to_owned(),
                            reason: why.clone(),
                        });
                    }
                    // Left to the call: an allow rule keeps the tool listed,
                    // a deny rule does not hide it.
                    (Outcome::Deferred, action) => action == Action::Allow,
                };
                if !applies {
                    continue;
                }
            }
            match rule.action {
                Action::Deny => {
                    deny = Some(i);
                    break;
                }
                Action::Allow => allow_rules.push(i),
            }
        }
        Ok(match deny {
            Some(i) => Decision {
                allowed: false,
                rule: Some(self.rules[i].index),
                allow_rules: Vec::new(),
            },
            None => Decision {
                allowed: !allow_rules.is_empty(),
                rule: allow_rules.first().map(|i| self.rules[*i].index),
                allow_rules,
            },
        })
    }

    /// Whether `client` may use anything at all on `server`: some allow rule
    /// names them both, and no deny rule takes every tool, resource and prompt
    /// there away. A reload after which this is false ends the client's open
    /// streams and sessions on the server.
    pub(crate) fn reaches(&self, client: &ClientId, server: &str) -> bool {
        let applies = |r: &&Rule| {
            r.servers.iter().any(|g| g.matches(server))
                && r.clients.iter().any(|g| client_matches(g, client))
        };
        let everything = |globs: &[Glob]| globs.iter().any(|g| g.as_str() == "*");
        let denied_all = self.rules.iter().filter(applies).any(|r| {
            r.action == Action::Deny
                && everything(&r.tools)
                && everything(&r.resources)
                && everything(&r.prompts)
        });
        let allowed = self.rules.iter().filter(applies).any(|r| {
            r.action == Action::Allow
                && !(r.tools.is_empty() && r.resources.is_empty() && r.prompts.is_empty())
        });
        allowed && !denied_all
    }

    /// Checks `arguments` against the `arguments` constraint of every allow rule
    /// in `decision`; the first rule that refuses is returned with its violations.
    pub fn check_arguments(
        &self,
        decision: &Decision,
        arguments: &Value,
    ) -> Result<(), (usize, Vec<Violation>)> {
        for i in &decision.allow_rules {
            let rule = &self.rules[*i];
            if let Some(schema) = &rule.arguments {
                schema.check(arguments).map_err(|v| (rule.index, v))?;
            }
        }
        Ok(())
    }

    /// The rates that apply to a decision, with the index of the rule they come from.
    pub fn rates<'p>(
        &'p self,
        decision_rules: &'p [usize],
    ) -> impl Iterator<Item = (usize, Rate)> + 'p {
        decision_rules
            .iter()
            .filter_map(|i| self.rules[*i].rate.map(|r| (self.rules[*i].index, r)))
    }

    /// The patterns of rule `index` for the kind of `subject` (its `tools`,
    /// `resources` or `prompts`), as written.
    pub(crate) fn rule_subjects(&self, index: usize, subject: Subject<'_>) -> Vec<String> {
        let Some(rule) = self.rules.get(index) else {
            return Vec::new();
        };
        let globs = match subject {
            Subject::Tool(_) => &rule.tools,
            Subject::Resource(_) => &rule.resources,
            Subject::Prompt(_) => &rule.prompts,
        };
        globs.iter().map(|g| g.as_str().to_owned()).collect()
    }
}

/// A decision that hides what a failing expression would deny.
fn hidden_on_failure(decided: Result<Decision, ExpressionFailed>) -> Decision {
    decided.unwrap_or_else(|failed| Decision {
        allowed: false,
        rule: Some(failed.rule),
        allow_rules: Vec::new(),
    })
}

/// Longest name (in characters) worth an edit-distance suggestion; longer
/// wanted names and candidates get none, so one suggestion costs at most
/// `SUGGEST_CHARS²` steps per candidate, whatever a client sends.
const SUGGEST_CHARS: usize = 128;
/// Most candidates compared for one suggestion.
const SUGGEST_CANDIDATES: usize = 2000;

/// Names in `candidates` closest to `wanted` (edit distance), best first.
///
/// The work is bounded before it starts: a `wanted` name longer than
/// [`SUGGEST_CHARS`] gets no suggestion, a candidate whose length alone puts
/// it beyond the distance allowed is not compared, and at most
/// [`SUGGEST_CANDIDATES`] candidates are looked at.
pub(crate) fn closest<'a>(wanted: &str, candidates: &[&'a str], max: usize) -> Vec<&'a str> {
    if wanted.len() > SUGGEST_CHARS * 4 {
        return Vec::new();
    }
    let wanted_chars = wanted.chars().count();
    if wanted_chars > SUGGEST_CHARS {
        return Vec::new();
    }
    let limit = (wanted_chars / 3).max(2);
    let mut scored: Vec<(usize, &str)> = candidates
        .iter()
        .take(SUGGEST_CANDIDATES)
        .filter(|c| c.len() <= SUGGEST_CHARS * 4)
        .filter_map(|c| {
            let contained = !wanted.is_empty() && (c.contains(wanted) || wanted.contains(*c));
            let chars = c.chars().count();
            // The distance is at least the difference in length.
            if chars > SUGGEST_CHARS || chars.abs_diff(wanted_chars) > limit {
                return contained.then_some((limit + chars.abs_diff(wanted_chars), *c));
            }
            let d = distance(wanted, c);
            (d <= limit || contained).then_some((d, *c))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(max).map(|(_, c)| c).collect()
}

/// Levenshtein distance over characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
