//! What a condition may read, by the kind of its rule: a condition on a
//! resource rule that reads `tool` (or `arguments`, or `annotations`) would
//! fail on every use, so it is refused when the configuration loads, with
//! the line and column of the read.
//!
//! Place: beneath [`super::Expression::compile_for`], after CEL has parsed
//! the source and expanded its macros. Invariants: a name bound by a macro
//! (`claims.groups.exists(tool, …)`) is the macro's variable, not the
//! context's, and is never refused; the first foreign read in source order
//! of the walk is the one named.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

use crate::policy::subject::Kind;

/// Why `program`, on a rule of `kind` (whose condition reads the names
/// `own`), is refused: the first name in `foreign` it reads; `None` when it
/// reads none.
pub(super) fn foreign(
    program: &cel::Program,
    source: &str,
    kind: Kind,
    own: &[&str],
    foreign: &[&str],
) -> Option<String> {
    let (id, name) = first(program.expression(), foreign, &mut Vec::new())?;
    let rule = match kind {
        Kind::Tool => "a tool rule",
        Kind::Resource => "a resource rule",
        Kind::Prompt => "a prompt rule",
    };
    let why = format!(
        "reads `{name}`, which the condition of {rule} never has (it reads {}); a rule for another kind \
         of subject goes in a rule of its own",
        own.join(", ")
    );
    let at = program
        .source_info()
        .offset_for(id)
        .map(|(start, _)| super::cost::position(source, start as usize));
    Some(match (at, source.contains('\n')) {
        (Some((line, column)), true) => format!("at line {line}, column {column}: {why}"),
        (Some((_, column)), false) => format!("at column {column}: {why}"),
        (None, _) => why,
    })
}

/// The first identifier in `e` named in `foreign` and not bound by an
/// enclosing macro (`bound`).
fn first<'e>(
    e: &'e IdedExpr,
    foreign: &[&str],
    bound: &mut Vec<&'e str>,
) -> Option<(u64, &'e str)> {
    match &e.expr {
        Expr::Ident(name)
            if foreign.contains(&name.as_str()) && !bound.contains(&name.as_str()) =>
        {
            Some((e.id, name))
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => None,
        Expr::Comprehension(c) => {
            let outer = first(&c.iter_range, foreign, bound)
                .or_else(|| first(&c.accu_init, foreign, bound));
            if outer.is_some() {
                return outer;
            }
            let depth = bound.len();
            bound.push(&c.iter_var);
            bound.extend(c.iter_var2.as_deref());
            bound.push(&c.accu_var);
            let found = first(&c.loop_cond, foreign, bound)
                .or_else(|| first(&c.loop_step, foreign, bound))
                .or_else(|| first(&c.result, foreign, bound));
            bound.truncate(depth);
            found
        }
        Expr::Call(call) => {
            let mut parts = call.target.iter().map(|t| &**t).chain(&call.args);
            parts.find_map(|a| first(a, foreign, bound))
        }
        Expr::Select(select) => first(&select.operand, foreign, bound),
        Expr::List(list) => list.elements.iter().find_map(|a| first(a, foreign, bound)),
        Expr::Map(map) => map
            .entries
            .iter()
            .find_map(|m| entry(&m.expr, foreign, bound)),
        Expr::Struct(s) => s
            .entries
            .iter()
            .find_map(|f| entry(&f.expr, foreign, bound)),
    }
}

fn entry<'e>(
    e: &'e EntryExpr,
    foreign: &[&str],
    bound: &mut Vec<&'e str>,
) -> Option<(u64, &'e str)> {
    match e {
        EntryExpr::MapEntry(m) => {
            first(&m.key, foreign, bound).or_else(|| first(&m.value, foreign, bound))
        }
        EntryExpr::StructField(f) => first(&f.value, foreign, bound),
    }
}
