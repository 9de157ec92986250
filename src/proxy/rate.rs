//! The rate limit of a call: look whether its buckets have a token while it
//! is checked, take the token when it runs.
//!
//! Place: the rate step of `tools/call` (a peek in [`super::call::check_call`],
//! the take right before forwarding, after an approval when one is needed),
//! and of `resources/read` and `prompts/get` (a take in
//! [`super::subjects::decide_subject`]). Invariants: a refused call takes
//! nothing from any bucket; a take happens once per call that runs.

use super::forward::Forward;
use super::state::{AppState, Live, ServerState};

use crate::auth::ClientId;
use crate::error::{Limit, Limited, RateLimited, Rejection};
use crate::policy::{Decision, Subject};
use crate::ratelimit::Verdict;

/// Takes the tokens of `decision` for a call about to be forwarded, from the
/// buckets `forward`'s configuration names.
pub(super) async fn take(
    forward: &Forward<'_>,
    client: &ClientId,
    subject: Subject<'_>,
    decision: &Decision,
) -> Result<(), Rejection> {
    let (state, live, server) = (forward.state, forward.live, forward.server);
    rate_limit(state, live, client, server, subject, decision, Spend::Take).await
}

/// Whether a rate-limit decision takes its tokens or only looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Spend {
    /// The call runs now: take a token from every bucket.
    Take,
    /// The call is not run yet: would it be admitted? Nothing is taken.
    Peek,
}

/// Takes (or, with [`Spend::Peek`], looks for) a token in every bucket the
/// access decision names, or refuses the call and says when it may be made
/// again. Nothing is taken when any bucket refuses.
pub(super) async fn rate_limit(
    state: &AppState,
    live: &Live,
    client: &ClientId,
    server: &ServerState,
    subject: Subject<'_>,
    decision: &Decision,
    spend: Spend,
) -> Result<(), Rejection> {
    let config = &*live.config;
    let server_name = server.upstream.settings.name.as_str();
    let buckets = live
        .rate_plan
        .buckets(&config.policy, decision, client, server_name, subject);
    if buckets.is_empty() {
        return Ok(());
    }
    let verdict = match spend {
        Spend::Take => state.limiter.check(&buckets).await,
        Spend::Peek => state.limiter.peek(&buckets).await,
    };
    let (limit, retry_after) = match verdict {
        Verdict::Admitted => return Ok(()),
        Verdict::Limited {
            bucket,
            retry_after,
        } => {
            let bucket = &buckets[bucket];
            let limit = Limit {
                rule: bucket.rule,
                rate: bucket.rate,
                shared_by: config.policy.rule_subjects(bucket.rule, subject),
            };
            (Some(limit), retry_after)
        }
        Verdict::Unavailable => (None, std::time::Duration::from_secs(1)),
    };
    let subject = match subject {
        Subject::Tool(n) => Limited::Tool(n.to_owned()),
        Subject::Resource(u) => Limited::Resource(u.to_owned()),
        Subject::Prompt(n) => Limited::Prompt(n.to_owned()),
    };
    Err(Rejection::RateLimited(RateLimited {
        subject,
        client: client.name().to_owned(),
        limit,
        retry_after,
    }))
}
