//! Access decisions for resources, prompts, completions and subscriptions
//! (an operator's method of class tool is a tool call: [`super::call`]).
//!
//! Place: the authorize step of every method but tools/call. Invariants: the
//! same policy decision serves lists and uses; a hidden subject (one its
//! list would not show) gets the answer an unknown one gets; every use is
//! decided with its facts (the client's claims, the method as received, the
//! time, the session's labels when a condition reads them, a prompt's
//! arguments), so a condition is never left undecided on the request path
//! (fail closed); a listed subject whose use a condition refuses, or whose
//! condition fails, gets `call_not_permitted` / `rule_expression_failed`
//! naming the rule, and the audit says why.

use serde_json::{Map, Value};

use super::context::Context;
use super::flow;
use super::rate::{Spend, rate_limit};
use super::refusals::{use_expression_failed, use_not_permitted};
use super::resource;

use super::state::{AppState, Live, ServerState};

use crate::auth::ClientId;
use crate::config::Config;
use crate::error::Rejection;
use crate::flow::SessionKey;
use crate::mcp::request::Reference;
use crate::policy::uri::CanonicalUri;
use crate::policy::{Decision, Facts, Kind, ListFacts, Outcome, Subject};

/// What a use of a resource or prompt is decided with beyond who uses what
/// where: the method as received, a `prompts/get`'s arguments, a resource
/// URI's query (canonical: the one forwarded), and the session's flow labels
/// (read only when some condition reads them).
#[derive(Clone)]
pub(super) struct UseFacts<'a> {
    method: &'a str,
    arguments: Option<Value>,
    query: Option<&'a str>,
    labels: Vec<&'static str>,
}

impl<'a> UseFacts<'a> {
    /// The facts of a use of `method` on a subject of `kind` in `session`,
    /// with a prompt's `arguments` (`Some(None)`: a `prompts/get` without
    /// any, read as `{}`); a store that cannot say what the session holds
    /// refuses the use when a condition on that kind reads it
    /// (`state_unavailable`), never decided on a guess.
    pub(super) async fn read(
        (state, config): (&AppState, &Config),
        session: &SessionKey,
        kind: Kind,
        method: &'a str,
        arguments: Option<Option<&Value>>,
    ) -> Result<Self, Rejection> {
        let flows = (&*state.flows, &config.policy, &config.flow);
        let labels = flow::held_labels(flows, session, kind)
            .await
            .map_err(|e| Rejection::StateUnavailable(e.store))?;
        let arguments = arguments.map(|given| match given {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(given) => given.clone(),
        });
        Ok(Self {
            method,
            arguments,
            query: None,
            labels,
        })
    }

    /// These facts for a use of `uri`: its canonical query, the one
    /// forwarded, is what a condition reads as `query`.
    pub(super) fn of_uri(self, uri: &'a CanonicalUri) -> Self {
        Self {
            query: Some(uri.query()),
            ..self
        }
    }
}

/// The access rules for a subject a request names (a resource, a prompt),
/// then, when it `takes_tokens`, its rate limits: one
/// decision for the list and the use. A hidden subject gets `hidden()`, the
/// answer an unknown one gets.
#[allow(clippy::too_many_arguments)]
pub(super) async fn decide_subject(
    state: &AppState,
    live: &Live,
    ctx: &mut Context,
    client: &ClientId,
    server: &ServerState,
    subject: Subject<'_>,
    facts: &UseFacts<'_>,
    takes_tokens: bool,
    hidden: impl FnOnce() -> String,
) -> Result<(), Rejection> {
    ctx.trail.stage("authorize");
    let name = &server.upstream.settings.name;
    let decided = authorize_use(&live.config, ctx, client, name, subject, facts, hidden);
    if let Some(decision) = ctx.observe_or_enforce(decided)?
        && takes_tokens
    {
        ctx.trail.stage("rate_limit");
        let limited =
            rate_limit(state, live, client, server, subject, &decision, Spend::Take).await;
        ctx.observe_or_enforce(limited.map(drop))?;
    }
    Ok(())
}

/// The decision on one use of `subject` on `server`, noted on the request's
/// trail (the rule that decided; a refusal's reason among the violations).
pub(super) fn authorize_use(
    config: &Config,
    ctx: &Context,
    client: &ClientId,
    server: &str,
    subject: Subject<'_>,
    facts: &UseFacts<'_>,
    not_found: impl FnOnce() -> String,
) -> Result<Decision, Rejection> {
    let decided = judge(config, ctx, client, server, subject, facts, not_found);
    match &decided {
        Ok(decision) => ctx.trail.trace().rule(decision.rule),
        Err(refusal) => note_refusal(ctx, refusal),
    }
    decided
}

/// Notes a refusal's reason among the request's violations (a condition's:
/// which rule, and what it said).
pub(super) fn note_refusal(ctx: &Context, refusal: &Rejection) {
    if let Rejection::Use(refusal) = refusal {
        let line = audit_line(&refusal.detail);
        ctx.trail.note(|e| e.violations.push(line));
    }
}

/// [`authorize_use`] without noting anything: first as the client's list
/// decides it (hidden: `not_found`, no existence oracle), then with every
/// fact of the use.
pub(super) fn judge(
    config: &Config,
    ctx: &Context,
    client: &ClientId,
    server: &str,
    subject: Subject<'_>,
    facts: &UseFacts<'_>,
    not_found: impl FnOnce() -> String,
) -> Result<Decision, Rejection> {
    let claims = ctx.token.as_ref().map(|t| t.claims());
    let shown = ListFacts {
        claims,
        annotations: None,
    };
    let listed = config.policy.decide_listed(client, server, subject, &shown);
    if !listed.allowed {
        // The same answer a missing resource or prompt gets: no existence oracle.
        return Err(Rejection::NotFound(not_found()));
    }
    let known = Facts {
        claims,
        method: facts.method,
        arguments: facts.arguments.as_ref(),
        annotations: None,
        query: facts.query,
        labels: &facts.labels,
    };
    let mut falsified = Vec::new();
    let decision = config
        .policy
        .decide_with(client, server, subject, Some(&known), &mut |rule, o| {
            if *o == Outcome::False {
                falsified.push(rule);
            }
        })
        .map_err(|f| use_expression_failed(subject, facts.method, &f))?;
    if !decision.allowed {
        return Err(use_not_permitted(
            config,
            subject,
            facts.method,
            decision.rule,
            &falsified,
        ));
    }
    Ok(decision)
}

/// The kind of what a `completion/complete` completes.
pub(super) fn completed(reference: &Reference) -> Kind {
    match reference {
        Reference::Prompt { .. } => Kind::Prompt,
        Reference::Resource { .. } => Kind::Resource,
    }
}

/// The audit's line for a refused use: what the rule's condition said.
fn audit_line(detail: &Map<String, Value>) -> String {
    let field = |k: &str| detail.get(k).and_then(Value::as_str).unwrap_or_default();
    match detail.get("error") {
        Some(_) => format!("when: {} failed: {}", field("rule"), field("error")),
        None if detail.contains_key("rule") => format!("when: {} denies", field("rule")),
        None => {
            let each: Vec<&str> = (detail.get("false_conditions").and_then(Value::as_array))
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            format!("when: false for {}", each.join(", "))
        }
    }
}

/// `completion/complete` on a prompt or a resource: decided as a use of
/// it, with the method as received. A completion carries no arguments of
/// the prompt's own, so a condition over them is left to the `prompts/get`
/// (as the list leaves it).
pub(super) fn authorize_completion(
    config: &Config,
    ctx: &Context,
    client: &ClientId,
    server: &ServerState,
    reference: &Reference,
    facts: &UseFacts<'_>,
) -> Result<(), Rejection> {
    let name = &server.upstream.settings.name;
    match reference {
        Reference::Prompt { name: prompt } => {
            let subject = Subject::Prompt(prompt);
            authorize_use(config, ctx, client, name, subject, facts, || {
                format!("Unknown prompt: {prompt}")
            })
            .map(drop)
        }
        Reference::Resource { uri } => {
            let subject = resource::completion_subject(uri)?;
            let subject = Subject::Resource(&subject);
            authorize_use(config, ctx, client, name, subject, facts, || {
                format!("Resource not found: {uri}")
            })
            .map(drop)
        }
    }
}

/// `subscriptions/listen` (2026-07-28): every URI in
/// `params.notifications.resourceSubscriptions`, in its canonical form
/// ([`resource::subscribed`]), must be a resource this client may read; a
/// hidden one gets the answer a missing one gets.
pub(super) fn authorize_subscriptions(
    config: &Config,
    ctx: &Context,
    client: &ClientId,
    server: &ServerState,
    uris: &[CanonicalUri],
    facts: &UseFacts<'_>,
) -> Result<(), Rejection> {
    let name = &server.upstream.settings.name;
    for uri in uris {
        let subject = Subject::Resource(uri.identity());
        let facts = facts.clone().of_uri(uri);
        authorize_use(config, ctx, client, name, subject, &facts, || {
            format!("Resource not found: {}", uri.as_str())
        })?;
    }
    Ok(())
}
