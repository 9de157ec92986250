//! Access decisions for resources, prompts, completions and subscriptions
//! (an operator's method of class tool is a tool call: [`super::call`]).
//!
//! Place: the authorize step of every method but tools/call. Invariant: the
//! same policy decision serves lists and calls; a hidden subject gets the
//! answer an unknown one gets.

use super::context::Context;
use super::rate::{Spend, rate_limit};
use super::resource;

use super::state::{AppState, Live, ServerState};

use crate::auth::ClientId;
use crate::config::Config;
use crate::error::Rejection;
use crate::mcp::request::Reference;
use crate::policy::{Decision, Subject};

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
    takes_tokens: bool,
    hidden: impl FnOnce() -> String,
) -> Result<(), Rejection> {
    ctx.trail.stage("authorize");
    let decided = authorize_or_hide(&live.config, client, server, subject, hidden);
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

pub(super) fn authorize_or_hide(
    config: &Config,
    client: &ClientId,
    server: &ServerState,
    subject: Subject<'_>,
    not_found: impl FnOnce() -> String,
) -> Result<Decision, Rejection> {
    let decision = config
        .policy
        .decide(client, &server.upstream.settings.name, subject);
    if decision.allowed {
        Ok(decision)
    } else {
        // The same answer a missing resource or prompt gets: no existence oracle.
        Err(Rejection::NotFound(not_found()))
    }
}

pub(super) fn authorize_completion(
    config: &Config,
    client: &ClientId,
    server: &ServerState,
    reference: &Reference,
) -> Result<(), Rejection> {
    match reference {
        Reference::Prompt { name } => {
            authorize_or_hide(config, client, server, Subject::Prompt(name), || {
                format!("Unknown prompt: {name}")
            })
            .map(drop)
        }
        Reference::Resource { uri } => {
            let subject = resource::completion_subject(uri)?;
            authorize_or_hide(config, client, server, Subject::Resource(&subject), || {
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
    client: &ClientId,
    server: &ServerState,
    uris: &[crate::policy::uri::CanonicalUri],
) -> Result<(), Rejection> {
    for uri in uris {
        let subject = Subject::Resource(uri.identity());
        authorize_or_hide(config, client, server, subject, || {
            format!("Resource not found: {}", uri.as_str())
        })?;
    }
    Ok(())
}
