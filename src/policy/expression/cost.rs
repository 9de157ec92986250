//! What an expression may cost, checked when it compiles: the shapes whose
//! evaluation grows with the product of two sizes a client chooses are
//! refused, so that one call's arguments cannot make a condition run for
//! seconds.
//!
//! Place: beneath [`super::Expression::compile`], after CEL has parsed the
//! source and expanded its macros. Why: CEL has no step limit, and a macro
//! (`all`, `exists`, `exists_one`, `map`, `filter`) runs its body once per
//! element of its range. When the range is sized by the client (it reads
//! `arguments`), a body that reads another value the client sizes
//! (`x in arguments.ys`, `arguments.s.contains(x)`, a macro over the
//! arguments or over an outer element) costs the range's length times that
//! size, both chosen by the client: with the request size limit, hundreds of
//! billions of steps. What stays allowed costs at most the client's input
//! times something the client does not choose: a macro over the arguments
//! whose body reads its own element, literals, claims or annotations (a
//! nested macro over the element's own parts visits each part once), and a
//! macro over claims whose body reads the arguments.
//!
//! Invariants: a refused expression never reaches a rule; the refusal names
//! the line and column of the offending read in the expression, what it
//! reads, and what to write instead; a macro's range, initial value and
//! result run once and are checked as the expression around them.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

/// Why `program` is refused for its cost, in the words of
/// [`super::Expression::compile`]'s errors; `None` when it is not.
pub(super) fn refusal(program: &cel::Program, source: &str) -> Option<String> {
    let walk = Walk {
        sized: vec!["arguments".to_owned()],
        own: None,
    };
    let (id, name) = walk.costly(program.expression())?;
    let why = format!(
        "inside a macro (all, exists, exists_one, map, filter) over a list the client sends, the body reads \
         `{name}`, another value the client sizes: each element would pay for it again (`in`, `contains`, a \
         nested macro, comparing lists), a cost the client's arguments choose twice; refused. Inside such a \
         macro read only its own element, literals, claims and annotations"
    );
    let at = program
        .source_info()
        .offset_for(id)
        .map(|(start, _)| position(source, start as usize));
    Some(match (at, source.contains('\n')) {
        (Some((line, column)), true) => format!("at line {line}, column {column}: {why}"),
        (Some((_, column)), false) => format!("at column {column}: {why}"),
        (None, _) => why,
    })
}

/// Where the walk is: which names hold values the client sizes, and, in the
/// body of a macro whose range the client sizes, that macro's own element
/// (the one such name the body may read).
#[derive(Clone)]
struct Walk {
    sized: Vec<String>,
    own: Option<String>,
}

impl Walk {
    /// Whether `name`, read here, costs the product of two client sizes.
    fn forbidden(&self, name: &str) -> bool {
        self.own.is_some()
            && self.own.as_deref() != Some(name)
            && self.sized.iter().any(|s| s == name)
    }

    /// The first read in `e` (its node and name) that costs the product of
    /// two client sizes.
    fn costly<'e>(&self, e: &'e IdedExpr) -> Option<(u64, &'e str)> {
        match &e.expr {
            Expr::Comprehension(c) => {
                let found = self
                    .costly(&c.iter_range)
                    .or_else(|| self.costly(&c.accu_init))
                    .or_else(|| self.costly(&c.result));
                if found.is_some() {
                    return found;
                }
                let mut body = self.clone();
                if self.reads_sized(&c.iter_range) {
                    body.sized.push(c.iter_var.clone());
                    body.sized.extend(c.iter_var2.clone());
                    body.own = Some(c.iter_var.clone());
                }
                body.costly(&c.loop_cond)
                    .or_else(|| body.costly(&c.loop_step))
            }
            Expr::Ident(name) if self.forbidden(name) => Some((e.id, name)),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => None,
            Expr::Call(call) => (call.target.iter().map(|t| &**t))
                .chain(&call.args)
                .find_map(|a| self.costly(a)),
            Expr::Select(select) => self.costly(&select.operand),
            Expr::List(list) => list.elements.iter().find_map(|a| self.costly(a)),
            Expr::Map(map) => map.entries.iter().find_map(|entry| self.entry(&entry.expr)),
            Expr::Struct(s) => s.entries.iter().find_map(|entry| self.entry(&entry.expr)),
        }
    }

    fn entry<'e>(&self, entry: &'e EntryExpr) -> Option<(u64, &'e str)> {
        match entry {
            EntryExpr::MapEntry(m) => self.costly(&m.key).or_else(|| self.costly(&m.value)),
            EntryExpr::StructField(f) => self.costly(&f.value),
        }
    }

    /// Whether `e` reads a value the client sizes (so a macro over it runs
    /// as many times as the client chooses).
    fn reads_sized(&self, e: &IdedExpr) -> bool {
        let reader = Walk {
            sized: self.sized.clone(),
            own: Some(String::new()),
        };
        reader.costly(e).is_some()
    }
}

/// The 1-based line and column (in characters) of byte `offset` in `source`.
pub(super) fn position(source: &str, offset: usize) -> (usize, usize) {
    let before = source.get(..offset).unwrap_or(source);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}
