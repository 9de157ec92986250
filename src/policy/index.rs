//! The rules indexed by what they name, so a decision costs what the rules
//! that can match cost, not what the whole file costs.
//!
//! Place in the path: inside [`super::Policy::decide`], built once with the
//! policy at load.
//!
//! How: each dimension of a rule (servers, clients, and tools / resources /
//! prompts) is a set of globs. A dimension's index maps each literal name to
//! the rules that name it, and keeps every distinct wildcard glob once with
//! the rules that carry it. The rules a decision may consider are a bit set,
//! narrowed one dimension after another (servers, clients, subject: the
//! subject dimension usually has the most globs, so it comes last); a wildcard
//! glob is tested only when one of its rules is still in the set.
//!
//! Invariants: the set left after the three dimensions is exactly the set of
//! rules whose `matches` is true (every glob of every rule is in its dimension,
//! literal or wildcard, and nothing else is); bits are visited in file order,
//! so "the first deny wins, else every allow in order" is what it was; the
//! anonymous client is matched by literal names only, as `client_matches` says.

use std::collections::HashMap;

use super::glob::Glob;
use super::rule::Rule;
use super::subject::Kind;
use crate::auth::ClientId;

/// One dimension: literal names, and the wildcard globs.
#[derive(Debug, Default)]
struct Dimension {
    literal: HashMap<Box<str>, Bits, foldhash::fast::FixedState>,
    /// Distinct wildcard globs, each with the rules that carry it.
    wild: Vec<(Glob, Bits)>,
}

/// The index of a policy's rules.
#[derive(Debug, Default)]
pub(crate) struct Index {
    words: usize,
    servers: Dimension,
    clients: Dimension,
    tools: Dimension,
    resources: Dimension,
    prompts: Dimension,
}

/// A set of rule positions (in `Policy::rules`), one bit each.
type Bits = Vec<u64>;

impl Index {
    pub(crate) fn new(rules: &[Rule]) -> Self {
        let words = rules.len().div_ceil(64);
        let mut index = Self {
            words,
            ..Self::default()
        };
        for (i, rule) in rules.iter().enumerate() {
            index.servers.add(&rule.servers, i, words);
            index.clients.add(&rule.clients, i, words);
            index.tools.add(&rule.tools, i, words);
            index.resources.add(&rule.resources, i, words);
            index.prompts.add(&rule.prompts, i, words);
        }
        index
    }

    /// Positions of the rules that match `client`, `server` and `name` (of
    /// `kind`), in file order.
    pub(crate) fn matching(
        &self,
        client: &ClientId,
        server: &str,
        kind: Kind,
        name: &str,
    ) -> impl Iterator<Item = usize> {
        // One allocation per decision: the set, then the scratch each
        // narrowing fills.
        let mut bits = vec![u64::MAX; 2 * self.words];
        let (set, hit) = bits.split_at_mut(self.words);
        self.servers.narrow(set, hit, server, true);
        if set.iter().any(|w| *w != 0) {
            self.clients
                .narrow(set, hit, client.name(), !client.is_anonymous());
        }
        if set.iter().any(|w| *w != 0) {
            let subjects = match kind {
                Kind::Tool => &self.tools,
                Kind::Resource => &self.resources,
                Kind::Prompt => &self.prompts,
            };
            subjects.narrow(set, hit, name, true);
        }
        bits.truncate(self.words);
        bits.into_iter().enumerate().flat_map(|(w, mut word)| {
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let bit = word.trailing_zeros() as usize;
                    word &= word - 1;
                    w * 64 + bit
                })
            })
        })
    }
}

impl Dimension {
    fn add(&mut self, globs: &[Glob], rule: usize, words: usize) {
        let set = |bits: &mut Bits| bits[rule / 64] |= 1 << (rule % 64);
        for glob in globs {
            if let Some(name) = glob.literal() {
                set(self
                    .literal
                    .entry(name.into())
                    .or_insert_with(|| vec![0; words]));
            } else if let Some((_, bits)) = self.wild.iter_mut().find(|(g, _)| g == glob) {
                set(bits);
            } else {
                let mut bits = vec![0; words];
                set(&mut bits);
                self.wild.push((glob.clone(), bits));
            }
        }
    }

    /// Keeps in `set` only the rules with a glob of this dimension matching
    /// `name`, using `hit` (as long as `set`) as scratch; wildcard globs
    /// count only when `wildcards` is true.
    fn narrow(&self, set: &mut [u64], hit: &mut [u64], name: &str, wildcards: bool) {
        hit.fill(0);
        if let Some(bits) = self.literal.get(name) {
            or_masked(hit, bits, set);
        }
        if wildcards {
            for (glob, bits) in &self.wild {
                // Only a glob one of whose rules is still in play is worth testing.
                let live = bits.iter().zip(set.iter()).any(|(b, s)| (b & s) != 0);
                if live && glob.matches(name) {
                    or_masked(hit, bits, set);
                }
            }
        }
        set.copy_from_slice(hit);
    }
}

fn or_masked(hit: &mut [u64], bits: &[u64], mask: &[u64]) {
    for ((h, b), m) in hit.iter_mut().zip(bits).zip(mask) {
        *h |= b & m;
    }
}
