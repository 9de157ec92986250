//! The rate limit of a call: take its tokens while it is checked, and give
//! them back if a later check refuses it; or, for a call that waits for a
//! person, only look while it is checked and take when it runs.
//!
//! Place: the rate step of `tools/call` (in [`super::call::check_call`]: a
//! take, given back by [`give_back`] when a later check refuses the call; a
//! peek when the call needs an approval, whose take comes right before
//! forwarding), and of `resources/read` and `prompts/get` (a take in
//! [`super::subjects::decide_subject`]). Invariants: a plain call costs the
//! backend one decision; a refused call keeps no token, except where another
//! call took from the same bucket between its take and its refusal, or the
//! backend did not answer the refund (then the token stays taken: counted
//! and logged — the limit errs towards refusing, never towards more calls);
//! a take happens once per call that runs.

use super::forward::Forward;
use super::state::{AppState, Live, ServerState};

use crate::auth::ClientId;
use crate::error::{Limit, Limited, RateLimited, Rejection};
use crate::policy::{Decision, Subject};
use crate::ratelimit::{Bucket, Taken, Verdict};

/// Takes the tokens of `decision` for a call about to be forwarded, from the
/// buckets `forward`'s configuration names.
pub(super) async fn take(
    forward: &Forward,
    client: &ClientId,
    subject: Subject<'_>,
    decision: &Decision,
) -> Result<(), Rejection> {
    let (state, live, server) = (&forward.state, &*forward.live, &forward.server);
    rate_limit(state, live, client, server, subject, decision, Spend::Take)
        .await
        .map(drop)
}

/// The tokens a call's checks took and the buckets they came from: what
/// [`give_back`] returns when a later check refuses the call.
#[derive(Debug, Default)]
pub(super) struct Held {
    buckets: Vec<Bucket>,
    taken: Taken,
}

impl Held {
    /// Whether tokens were taken.
    pub(super) fn is_empty(&self) -> bool {
        self.taken.is_empty()
    }
}

/// Gives back the tokens of a call refused after its take (one more
/// decision of the backend, on this rarer path only).
pub(super) async fn give_back(state: &AppState, held: Held) {
    if !held.is_empty() {
        state.limiter.refund(&held.buckets, &held.taken).await;
    }
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
/// again. Nothing is taken when any bucket refuses. Answers what was taken.
pub(super) async fn rate_limit(
    state: &AppState,
    live: &Live,
    client: &ClientId,
    server: &ServerState,
    subject: Subject<'_>,
    decision: &Decision,
    spend: Spend,
) -> Result<Held, Rejection> {
    let config = &*live.config;
    let server_name = server.upstream.settings.name.as_str();
    let buckets = live
        .rate_plan
        .buckets(&config.policy, decision, client, server_name, subject);
    if buckets.is_empty() {
        return Ok(Held::default());
    }
    let (verdict, taken) = match spend {
        Spend::Take => state.limiter.take(&buckets).await,
        Spend::Peek => (state.limiter.peek(&buckets).await, Taken::default()),
    };
    let (limit, retry_after) = match verdict {
        Verdict::Admitted => return Ok(Held { buckets, taken }),
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
