//! Where a call's buckets are: every rule's bucket identity, computed once
//! per configuration, and the key of each bucket a call needs.
//!
//! Place: below the limiter ([`super::RateLimiter`] decides on the buckets
//! named here), above the policy model it reads. Invariants: a key comes
//! only from the rule's content, the authenticated client name, the server
//! and the subject; no two different keys read the same; every name in a key
//! is bounded (long ones are hashed).

use sha2::{Digest, Sha256};

use super::bucket::Bucket;
use super::gcra::Quota;
use crate::auth::ClientId;
use crate::policy::{Decision, Policy, RateKey, Rule, Subject};

/// Longest name kept as it is in a key; longer ones are replaced by their SHA-256.
const MAX_KEY_PART: usize = 200;

/// Every rule's bucket shape and identity, computed once per configuration.
#[derive(Debug, Default)]
pub struct RatePlan {
    /// By position in `[[rules]]`: the rule's tag and quota, when it has a `rate`.
    rules: Vec<Option<(String, Quota)>>,
}

impl RatePlan {
    /// The plan of `policy`.
    pub fn new(policy: &Policy) -> Self {
        Self {
            rules: policy
                .rules
                .iter()
                .map(|r| r.rate.map(|rate| (rule_tag(r), Quota::of(&rate))))
                .collect(),
        }
    }

    /// The buckets a use of `subject` on `server` by `client` needs, given the
    /// access decision (every matching allow rule with a `rate`), without
    /// duplicates.
    pub fn buckets(
        &self,
        policy: &Policy,
        decision: &Decision,
        client: &ClientId,
        server: &str,
        subject: Subject<'_>,
    ) -> Vec<Bucket> {
        let mut out: Vec<Bucket> = Vec::new();
        for (rule, rate) in policy.rates(&decision.allow_rules) {
            let Some(Some((tag, quota))) = self.rules.get(rule) else {
                continue;
            };
            let key = bucket_key(tag, rate.key, client, server, subject);
            if out.iter().any(|b| b.key == key) {
                continue;
            }
            out.push(Bucket {
                key,
                quota: *quota,
                rule,
                rate,
            });
        }
        out
    }
}

/// The identity of a rule's buckets: the first 8 bytes (hex) of the SHA-256 of
/// what it matches and its rate. Its position and `arguments` are left out.
pub(super) fn rule_tag(rule: &Rule) -> String {
    let mut h = Sha256::new();
    for list in [
        &rule.clients,
        &rule.servers,
        &rule.tools,
        &rule.resources,
        &rule.prompts,
    ] {
        h.update((list.len() as u64).to_le_bytes());
        for glob in list {
            h.update((glob.as_str().len() as u64).to_le_bytes());
            h.update(glob.as_str().as_bytes());
        }
    }
    if let Some(rate) = rule.rate {
        h.update(rate.burst.get().to_le_bytes());
        h.update(rate.per_second.to_bits().to_le_bytes());
        h.update(key_name(rate.key).as_bytes());
    }
    hex::encode(&h.finalize()[..8])
}

/// The key of a bucket: the rule's tag, then what `key` says is shared, each
/// name with its length so that no two different keys read the same:
///
/// ```text
/// 3f2a…/all
/// 3f2a…/client/5:alice
/// 3f2a…/client+tool/5:alice/7:flights/tool/4:echo
/// ```
pub fn bucket_key(
    tag: &str,
    key: RateKey,
    client: &ClientId,
    server: &str,
    subject: Subject<'_>,
) -> String {
    let mut out = String::with_capacity(tag.len() + 64 + client.name().len() + server.len());
    out.push_str(tag);
    out.push('/');
    out.push_str(key_name(key));
    if key == RateKey::All {
        return out;
    }
    push_part(&mut out, client.name());
    if key == RateKey::Client {
        return out;
    }
    push_part(&mut out, server);
    let (kind, name) = match subject {
        Subject::Tool(n) => ("tool", n),
        Subject::Resource(n) => ("resource", n),
        Subject::Prompt(n) => ("prompt", n),
    };
    out.push('/');
    out.push_str(kind);
    push_part(&mut out, name);
    out
}

fn push_part(out: &mut String, part: &str) {
    out.push('/');
    if part.len() <= MAX_KEY_PART {
        // The length in decimal, without the formatting machinery (hot path).
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        let mut n = part.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        out.extend(digits[start..].iter().map(|&d| char::from(d)));
        out.push(':');
        out.push_str(part);
    } else {
        out.push_str("sha256:");
        out.push_str(&hex::encode(Sha256::digest(part.as_bytes())));
    }
}

fn key_name(key: RateKey) -> &'static str {
    match key {
        RateKey::Client => "client",
        RateKey::ClientTool => "client+tool",
        RateKey::All => "all",
    }
}
