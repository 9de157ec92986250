//! Which members of the JSON variables (`arguments`, `claims`,
//! `annotations`) expressions can read, found when they compile.
//!
//! Place: beneath [`super::Expression::compile`] (each expression's reads)
//! and the policy (the union over its rules), read by the [`super::Scope`]
//! when it converts one of these variables on its first read. Why: a JSON
//! object becomes a CEL map at one allocation per member, and the
//! conversion and its release were the largest part of a decision, while a
//! token carries members no rule reads (`iss`, `aud`, `exp`, …) and a call's
//! arguments can be large. Converting only the members the rules name makes
//! it cost what the rules read, not what the client sent.
//!
//! Invariants: a variable whose every read in every expression is a member
//! selection with a name written in the expression (`claims.team`,
//! `arguments.ticket.team`, `has(arguments.note)`) is converted with only
//! the members those selections name, recursively; any other read (the
//! variable itself, `size(claims)`, `'k' in arguments`, `arguments[k]`, a
//! macro over it, a comparison, a comprehension binding its name) converts it
//! whole from there down. A selection on the partial map yields what it
//! yields on the whole one, and fails with the same error, because the
//! partial map holds every member named by a selection that the JSON holds:
//! nothing an expression can observe tells the two apart.

use std::collections::BTreeMap;

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

/// What of one JSON value expressions read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// All of it (or something not a member selection).
    Whole,
    /// Only these members, each read as its shape says; an object gives
    /// up the others unconverted. Empty: nothing is read.
    Members(BTreeMap<String, Shape>),
}

impl Default for Shape {
    /// Nothing read.
    fn default() -> Self {
        Shape::Members(BTreeMap::new())
    }
}

impl Shape {
    /// Adds the read of `path`, members from the value down; the value at its
    /// end is read whole.
    fn add(&mut self, path: &[&str]) {
        let Shape::Members(members) = self else {
            return;
        };
        match path.split_first() {
            None => *self = Shape::Whole,
            Some((first, rest)) => members.entry((*first).to_owned()).or_default().add(rest),
        }
    }

    /// Adds everything `other` reads.
    fn merge(&mut self, other: &Shape) {
        match (&mut *self, other) {
            (Shape::Whole, _) => {}
            (_, Shape::Whole) => *self = Shape::Whole,
            (Shape::Members(mine), Shape::Members(theirs)) => {
                for (name, shape) in theirs {
                    mine.entry(name.clone()).or_default().merge(shape);
                }
            }
        }
    }
}

/// What expressions read of each JSON variable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reads {
    pub(crate) arguments: Shape,
    pub(crate) claims: Shape,
    pub(crate) annotations: Shape,
}

impl Reads {
    /// What `expression` reads.
    pub(crate) fn of(expression: &IdedExpr) -> Self {
        let mut reads = Reads::default();
        reads.walk(expression);
        reads
    }

    /// Every variable whole: what a scope converted before reads were known.
    #[cfg(test)]
    pub(crate) fn whole() -> Self {
        Reads {
            arguments: Shape::Whole,
            claims: Shape::Whole,
            annotations: Shape::Whole,
        }
    }

    /// Adds what `other` reads.
    pub(crate) fn merge(&mut self, other: &Reads) {
        self.arguments.merge(&other.arguments);
        self.claims.merge(&other.claims);
        self.annotations.merge(&other.annotations);
    }

    fn variable(&mut self, name: &str) -> Option<&mut Shape> {
        match name {
            "arguments" => Some(&mut self.arguments),
            "claims" => Some(&mut self.claims),
            "annotations" => Some(&mut self.annotations),
            _ => None,
        }
    }

    fn walk(&mut self, e: &IdedExpr) {
        match &e.expr {
            Expr::Select(_) => self.selection(e),
            Expr::Ident(name) => {
                if let Some(shape) = self.variable(name) {
                    *shape = Shape::Whole;
                }
            }
            Expr::Comprehension(c) => {
                // A macro variable named as one of ours hides it inside the
                // body: the selections there are not of ours, so ours is
                // taken whole rather than told apart from the macro's.
                let bound = [Some(&c.iter_var), c.iter_var2.as_ref(), Some(&c.accu_var)];
                for name in bound.into_iter().flatten() {
                    if let Some(shape) = self.variable(name) {
                        *shape = Shape::Whole;
                    }
                }
                for part in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    self.walk(part);
                }
            }
            Expr::Call(call) => {
                for part in call.target.iter().map(|t| &**t).chain(&call.args) {
                    self.walk(part);
                }
            }
            Expr::List(list) => list.elements.iter().for_each(|x| self.walk(x)),
            Expr::Map(map) => map.entries.iter().for_each(|x| self.entry(&x.expr)),
            Expr::Struct(s) => s.entries.iter().for_each(|x| self.entry(&x.expr)),
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }

    fn entry(&mut self, entry: &EntryExpr) {
        match entry {
            EntryExpr::MapEntry(m) => {
                self.walk(&m.key);
                self.walk(&m.value);
            }
            EntryExpr::StructField(f) => self.walk(&f.value),
        }
    }

    /// A chain of member selections: a read of the path it names when it
    /// starts at one of ours, else a walk of what it selects from. A presence
    /// test (`has`) yields a bool, so only the outermost selection may be one.
    fn selection(&mut self, e: &IdedExpr) {
        let mut path = Vec::new();
        let mut at = e;
        loop {
            match &at.expr {
                Expr::Select(s) if path.is_empty() || !s.test => {
                    path.push(s.field.as_str());
                    at = &s.operand;
                }
                Expr::Ident(name) if self.variable(name).is_some() => {
                    path.reverse();
                    if let Some(shape) = self.variable(name) {
                        shape.add(&path);
                    }
                    return;
                }
                _ => return self.walk(at),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(source: &str) -> Reads {
        Reads::of(
            cel::Program::compile(source)
                .expect("compiles")
                .expression(),
        )
    }

    fn members(entries: &[(&str, Shape)]) -> Shape {
        Shape::Members(
            entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn member_selections_name_what_is_read_and_anything_else_reads_the_whole() {
        let r = reads("claims.team == arguments.ticket.team && has(arguments.note)");
        assert_eq!(r.claims, members(&[("team", Shape::Whole)]));
        assert_eq!(
            r.arguments,
            members(&[
                ("note", Shape::Whole),
                ("ticket", members(&[("team", Shape::Whole)]))
            ])
        );
        assert_eq!(r.annotations, Shape::default());
        for whole in [
            "size(claims) > 0",
            "'team' in claims",
            "claims['team'] == 'a'",
            "claims == {}",
            "claims.exists(k, k == 'a')",
            "[1].exists(claims, claims == 1)",
            "type(claims) == map",
        ] {
            assert_eq!(reads(whole).claims, Shape::Whole, "{whole}");
        }
        // A selection on something else than ours reads nothing of ours.
        assert_eq!(reads("{'a': 1}.a == 1").claims, Shape::default());
        // A member read whole absorbs the reads of its members.
        let mut r = reads("arguments.ticket.team == 'a'");
        r.merge(&reads("size(arguments.ticket) == 2"));
        assert_eq!(r.arguments, members(&[("ticket", Shape::Whole)]));
        r.merge(&reads("arguments == {}"));
        assert_eq!(r.arguments, Shape::Whole);
    }
}
