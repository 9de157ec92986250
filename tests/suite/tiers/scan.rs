//! The reading of the suite's source behind `every_test_that_starts_a_peer_is_gated`: a
//! file cut into its functions (comments and literals blanked where braces would mislead),
//! the tiers each test needs through the functions it calls, and the gate it opens with.

use super::*;

/// The problems of the file `name` with `text`, and how many tests it gates
/// as they should be.
pub(super) fn check(name: &str, text: &str) -> (Vec<String>, usize) {
    let text = without_comments(text);
    let fns = functions(&text);
    let mut problems = Vec::new();
    let mut gated = 0;
    for test in tests(&blank_literals(&text)) {
        let (need, starts) = needs(&test, &fns);
        let have = gate(&fns[&test][0]);
        let extra: Vec<&str> = have
            .iter()
            .filter(|t| !need.contains(t))
            .map(|t| t.name())
            .collect();
        if !extra.is_empty() && (!need.is_empty() || !starts) {
            problems.push(format!(
                "{name}: `{test}` is gated on tier {} that it does not need: it would be \
                 skipped where it could run",
                extra.join(", ")
            ));
        }
        if need.is_empty() {
            if starts && have.is_empty() {
                problems.push(format!(
                    "{name}: `{test}` starts a peer through the harness but names no tier's \
                     marker; open it with `if !tiers::ready(&[Tier::…]) {{ return; }}` \
                     naming the tiers it needs"
                ));
            }
            continue;
        }
        let missing: Vec<&str> = need
            .iter()
            .filter(|t| !have.contains(t))
            .map(|t| t.name())
            .collect();
        if missing.is_empty() {
            gated += usize::from(extra.is_empty());
        } else {
            problems.push(format!(
                "{name}: `{test}` needs tier {} but does not open with \
                 `if !tiers::ready(&[{}]) {{ return; }}`",
                missing.join(", "),
                need.iter()
                    .map(|t| format!("Tier::{t:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    (problems, gated)
}

/// The tiers `test` needs: the markers in its body and in the bodies of the
/// file's functions it calls, to any depth; and whether those bodies call one
/// of the harness's [`STARTERS`].
fn needs(test: &str, fns: &BTreeMap<String, Vec<String>>) -> (BTreeSet<Tier>, bool) {
    let mut seen = BTreeSet::from([test.to_owned()]);
    let mut todo = vec![test.to_owned()];
    let mut need = BTreeSet::new();
    let mut starts = false;
    while let Some(f) = todo.pop() {
        for body in &fns[&f] {
            starts |= STARTERS.iter().any(|s| calls_starter(body, s));
            for (marker, tier) in MARKERS {
                if body.contains(marker) {
                    need.insert(*tier);
                }
            }
            for callee in calls(body) {
                if fns.contains_key(&callee) && seen.insert(callee.clone()) {
                    todo.push(callee);
                }
            }
        }
    }
    (need, starts)
}

/// Whether `body` calls `starter` (`sdk(` as a word, not `run_sdk(`).
fn calls_starter(body: &str, starter: &str) -> bool {
    body.match_indices(starter).any(|(i, _)| {
        !body[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// The tiers named by the gate `body` opens with (none without one).
fn gate(body: &str) -> BTreeSet<Tier> {
    let body = body.trim_start_matches('{').trim_start();
    let Some(rest) = body
        .strip_prefix("if !tiers::ready(&[")
        .or_else(|| body.strip_prefix("if !support::tiers::ready(&["))
    else {
        return BTreeSet::new();
    };
    let list = rest.split("])").next().unwrap_or_default();
    Tier::ALL
        .into_iter()
        .filter(|t| list.contains(&format!("Tier::{t:?}")))
        .collect()
}

/// Names of the test functions of a file (`#[test]`, `#[tokio::test…]`).
fn tests(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[") {
        rest = &rest[at + 2..];
        let attr = rest.split(']').next().unwrap_or_default();
        // A proptest case (`fn name(x in strategy)`) cannot return early; none
        // starts a peer.
        let args = rest.split(')').next().unwrap_or_default();
        if (attr == "test" || attr.starts_with("tokio::test"))
            && !args.contains(" in ")
            && let Some(name) = next_fn(rest)
        {
            out.push(name);
        }
    }
    out
}

/// The name of the next `fn` in `text`.
fn next_fn(text: &str) -> Option<String> {
    let at = word(text, "fn")?;
    ident_after(&text[at + 2..])
}

/// The identifier `text` starts with, after blanks (`mut` skipped).
fn ident_after(text: &str) -> Option<String> {
    let text = text.trim_start();
    let text = text.strip_prefix("mut ").unwrap_or(text).trim_start();
    let name: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Every function of a file (methods too) by name, with its body (braces
/// included); a name defined twice keeps both bodies.
fn functions(text: &str) -> BTreeMap<String, Vec<String>> {
    // Items and braces are found in `code`, where literals are blanked; the
    // bodies are cut from `text` at the same offsets, markers and all.
    let code = blank_literals(text);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut from = 0;
    // A `const` or `static` (a table of peer kinds, say), up to its `;`.
    for kw in ["const", "static"] {
        let mut from = 0;
        while let Some(at) = word(&code[from..], kw) {
            let start = from + at;
            from = start + kw.len();
            let Some(name) = ident_after(&code[from..]) else {
                continue;
            };
            let end = code[start..].find(";\n").map_or(code.len(), |e| start + e);
            out.entry(name)
                .or_default()
                .push(text[start..end].to_owned());
        }
    }
    while let Some(at) = word(&code[from..], "fn") {
        let start = from + at;
        from = start + 2;
        let Some(name) = next_fn(&code[start..]) else {
            continue;
        };
        // The body: from the first `{` (a declaration ending in `;` has none).
        let after = &code[start..];
        let (Some(open), semi) = (after.find('{'), after.find(';')) else {
            continue;
        };
        if semi.is_some_and(|s| s < open) {
            continue;
        }
        let len = braced(&after[open..]).len();
        let body = &text[start + open..start + open + len];
        out.entry(name).or_default().push(body.to_owned());
    }
    out
}

/// `text` with the inside of every string and char literal replaced by
/// spaces of the same byte length, so a `{` in `"\"error\":{"` or `'{'`
/// opens no block.
fn blank_literals(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let blank = |out: &mut String, c: char| out.push_str(&" ".repeat(c.len_utf8()));
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // A raw string: r"…", r#"…"# (any number of #), br"…".
        if c == 'r' && !ident_before(&chars, i) {
            let hashes = chars[i + 1..].iter().take_while(|h| **h == '#').count();
            if chars.get(i + 1 + hashes) == Some(&'"') {
                for &h in &chars[i..i + 2 + hashes] {
                    out.push(h);
                }
                i += 2 + hashes;
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                while i < chars.len() {
                    let rest: String = chars[i..(i + close.len()).min(chars.len())]
                        .iter()
                        .collect();
                    if rest == close {
                        out.push_str(&close);
                        i += close.len();
                        break;
                    }
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                continue;
            }
        }
        if c == '"' {
            out.push(c);
            i += 1;
            while i < chars.len() {
                match chars[i] {
                    '\\' => {
                        blank(&mut out, chars[i]);
                        if let Some(&n) = chars.get(i + 1) {
                            blank(&mut out, n);
                        }
                        i += 2;
                    }
                    '"' => {
                        out.push('"');
                        i += 1;
                        break;
                    }
                    other => {
                        blank(&mut out, other);
                        i += 1;
                    }
                }
            }
            continue;
        }
        // A char literal ('{', '\n'); a lifetime ('a) has no closing quote.
        if c == '\'' {
            let len = if chars.get(i + 1) == Some(&'\\') {
                4
            } else {
                3
            };
            if chars.get(i + len - 1) == Some(&'\'') {
                out.push('\'');
                for &inner in &chars[i + 1..i + len - 1] {
                    blank(&mut out, inner);
                }
                out.push('\'');
                i += len;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// Whether an identifier character stands before `chars[i]` (the `b` of a
/// byte string `br"…"` does not count).
fn ident_before(chars: &[char], i: usize) -> bool {
    let is_ident = |c: &char| c.is_alphanumeric() || *c == '_';
    match i.checked_sub(1).map(|p| (p, chars[p])) {
        None => false,
        Some((p, 'b')) => p.checked_sub(1).is_some_and(|q| is_ident(&chars[q])),
        Some((_, c)) => is_ident(&c),
    }
}

/// The `{…}` block `text` starts with.
fn braced(text: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &text[..=i];
                }
            }
            _ => {}
        }
    }
    text
}

/// The identifiers in `body`: the functions it may call, the tables it reads.
fn calls(body: &str) -> BTreeSet<String> {
    body.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Where the keyword `kw` first stands as a word in `text`.
fn word(text: &str, kw: &str) -> Option<usize> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(at) = text[from..].find(kw) {
        let i = from + at;
        let before = text[..i].chars().next_back();
        let after = text[i + kw.len()..].chars().next();
        if !before.is_some_and(is_ident) && !after.is_some_and(is_ident) {
            return Some(i);
        }
        from = i + kw.len();
    }
    None
}

/// The text without `//` comments (string literals kept: markers live there).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string (a URL) is kept.
            Some(i) if l[..i].matches('"').count() % 2 == 0 => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The functions `text` imports from the suite's other files (`use crate::FILE::{…}`),
/// with their bodies, as source the scan reads as the file's own: a test that reaches a
/// peer through a helper another file shares still names that peer's tier.
pub(super) fn imported(text: &str, files: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for statement in without_comments(text).split(';') {
        let Some(path) = statement.trim().strip_prefix("use crate::") else {
            continue;
        };
        let Some((file, names)) = path.split_once("::") else {
            continue;
        };
        let Some(source) = files.get(file) else {
            continue;
        };
        let fns = functions(&without_comments(source));
        for name in names.trim_matches(|c| c == '{' || c == '}').split(',') {
            for body in fns.get(name.trim()).into_iter().flatten() {
                out.push_str(&format!("\nfn {}() {body}\n", name.trim()));
            }
        }
    }
    out
}
