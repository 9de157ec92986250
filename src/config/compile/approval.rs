//! `approval = { … }` on a rule and `[approvals]` → the approval module's
//! settings types ([`crate::approval::settings`]).
//!
//! Invariants: every value is checked here, with its place in the file; a
//! signing key is read from the environment (`${NAME}`) and must be at least
//! 32 bytes; every limit has a stated range.

use toml::Spanned;

use super::super::raw::{RawApproval, RawApprovals};
use super::{Ctx, Result};
use crate::approval::settings::{DEFAULT_TIMEOUT, MAX_TIMEOUT, MIN_KEY_BYTES};
use crate::approval::{ApprovalSettings, Approver, Pending, Requirement};
use crate::util::duration;

impl Ctx<'_> {
    pub(super) fn approval(
        &self,
        raw: &Spanned<RawApproval>,
        key: &str,
        rule: usize,
    ) -> Result<Requirement> {
        let raw = raw.get_ref();
        let by = self.one_of(
            Some(&raw.by),
            &format!("{key}.by"),
            &[
                ("user", Approver::User),
                ("operator", Approver::Operator),
                ("either", Approver::Either),
            ],
            Approver::Operator,
        )?;
        let timeout = self.duration(
            raw.timeout.as_ref(),
            &format!("{key}.timeout"),
            DEFAULT_TIMEOUT,
            MAX_TIMEOUT,
        )?;
        if let Some(t) = &raw.timeout
            && duration::parse(t.get_ref()).is_ok_and(|d| d.as_secs() < 1)
        {
            return Err(self.fail(
                Some(t.span()),
                &format!("{key}.timeout"),
                "expected at least 1s: a person needs time to answer",
            ));
        }
        let pending = self.one_of(
            raw.pending.as_ref(),
            &format!("{key}.pending"),
            &[("wait", Pending::Wait), ("retry", Pending::Retry)],
            Pending::Wait,
        )?;
        if let Some(p) = &raw.pending
            && by == Approver::User
        {
            return Err(self.fail(
                Some(p.span()),
                &format!("{key}.pending"),
                "`pending` says what a client sees while an operator decides; with `by = \"user\"` no operator is asked (use `by = \"operator\"` or `\"either\"`)",
            ));
        }
        let reason = match &raw.reason {
            None => None,
            Some(r) if r.get_ref().trim().is_empty() || r.get_ref().chars().count() > 500 => {
                return Err(self.fail(
                    Some(r.span()),
                    &format!("{key}.reason"),
                    "expected a short text (1 to 500 characters) shown to whoever approves",
                ));
            }
            Some(r) => Some(r.get_ref().clone()),
        };
        Ok(Requirement {
            by,
            timeout,
            reason,
            pending,
            rule,
        })
    }

    pub(super) fn approvals(&self, raw: &RawApprovals) -> Result<ApprovalSettings> {
        let d = ApprovalSettings::default();
        let key = match &raw.key {
            None => None,
            Some(k) => {
                let text = self.expand(k, "approvals.key")?;
                if text.len() < MIN_KEY_BYTES {
                    return Err(self.fail(
                        Some(k.span()),
                        "approvals.key",
                        format!(
                            "the signing key has {} bytes; it needs at least {MIN_KEY_BYTES} (e.g. `openssl rand -hex 32`); \
                             leave `key` out to have one generated at start",
                            text.len()
                        ),
                    ));
                }
                Some(text.into_bytes())
            }
        };
        if let Some(removed) = &raw.max_value_chars {
            return Err(self.fail(
                Some(removed.span()),
                "approvals.max_value_chars",
                "this key was removed: a question now shows every value whole, and a call too large to show \
                 in full is refused (`approval_unpresentable`); bound the question with \
                 `max_question_chars` instead",
            ));
        }
        let size = |v: &Option<Spanned<i64>>, name: &str, default: usize, max: usize| {
            self.size(v.as_ref(), &format!("approvals.{name}"), default, 1, max)
        };
        let max_pending = size(&raw.max_pending, "max_pending", d.max_pending, 100_000)?;
        let max_pending_per_client = size(
            &raw.max_pending_per_client,
            "max_pending_per_client",
            d.max_pending_per_client,
            max_pending,
        )?;
        let max_used_states = size(
            &raw.max_used_states,
            "max_used_states",
            d.max_used_states,
            10_000_000,
        )?;
        let max_sessions = size(&raw.max_sessions, "max_sessions", d.max_sessions, 1_000_000)?;
        Ok(ApprovalSettings {
            key,
            max_pending,
            max_pending_per_client,
            max_used_states,
            max_used_states_per_client: size(
                &raw.max_used_states_per_client,
                "max_used_states_per_client",
                d.max_used_states_per_client.min(max_used_states),
                max_used_states,
            )?,
            max_sessions,
            max_sessions_per_client: size(
                &raw.max_sessions_per_client,
                "max_sessions_per_client",
                d.max_sessions_per_client.min(max_sessions),
                max_sessions,
            )?,
            max_question_chars: size(
                &raw.max_question_chars,
                "max_question_chars",
                d.max_question_chars,
                1_000_000,
            )?,
        })
    }
}
