//! Glob patterns over names (tools, prompts, clients, servers) and URIs (resources).
//!
//! Syntax: `*` any run of characters (including none), `?` one character,
//! `[abc]` / `[a-z]` / `[!a-z]` one character of (or not of) a class, `\x` a
//! literal `x`. Everything else matches itself, case-sensitively, as MCP names are.
//!
//! Invariants: compiling rejects unclosed classes, empty classes, reversed
//! ranges and a trailing backslash; matching is iterative with a single
//! backtrack point, so it runs in O(pattern × text) at worst and never recurses.

use std::fmt;

/// One compiled glob.
#[derive(Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
    tokens: Vec<Token>,
    /// The common shapes, matched without walking the tokens.
    shape: Shape,
}

/// Most patterns in policies are one of these; they match with one comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Shape {
    All,
    Exact(String),
    Prefix(String),
    Suffix(String),
    General,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Literal(char),
    AnyOne,
    AnyRun,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Why a pattern is not a glob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobError {
    /// The pattern is the empty string.
    #[error("an empty pattern matches nothing; use \"*\" to match everything")]
    Empty,
    /// A `[` without its `]`.
    #[error("the character class opened at character {} is never closed with `]`", .0 + 1)]
    UnclosedClass(usize),
    /// `[]` or `[!]`.
    #[error("the character class at character {} is empty", .0 + 1)]
    EmptyClass(usize),
    /// `[z-a]`.
    #[error("the range `{0}-{1}` is reversed; write the lower character first")]
    ReversedRange(char, char),
    /// A `\` with nothing after it.
    #[error("the pattern ends with a lone `\\`; escape a literal backslash as `\\\\`")]
    TrailingEscape,
}

// === impl Glob ===

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Result<Self, GlobError> {
        if pattern.is_empty() {
            return Err(GlobError::Empty);
        }
        let chars: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '*' => {
                    // Runs of stars mean the same as one.
                    if tokens.last() != Some(&Token::AnyRun) {
                        tokens.push(Token::AnyRun);
                    }
                    i += 1;
                }
                '?' => {
                    tokens.push(Token::AnyOne);
                    i += 1;
                }
                '\\' => {
                    let c = *chars.get(i + 1).ok_or(GlobError::TrailingEscape)?;
                    tokens.push(Token::Literal(c));
                    i += 2;
                }
                '[' => {
                    let (token, next) = parse_class(&chars, i)?;
                    tokens.push(token);
                    i = next;
                }
                c => {
                    tokens.push(Token::Literal(c));
                    i += 1;
                }
            }
        }
        let shape = Shape::of(&tokens);
        Ok(Self {
            source: pattern.to_owned(),
            tokens,
            shape,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// True when the pattern has no wildcard and so names exactly one thing.
    pub fn is_literal(&self) -> bool {
        self.tokens.iter().all(|t| matches!(t, Token::Literal(_)))
    }

    /// The one name a pattern without wildcards matches (escapes resolved).
    pub(crate) fn literal(&self) -> Option<&str> {
        match &self.shape {
            Shape::Exact(s) => Some(s),
            _ => None,
        }
    }

    /// True when the pattern matches every string.
    pub fn matches_all(&self) -> bool {
        self.shape == Shape::All
    }

    /// Whether `text` matches the whole pattern. Never allocates.
    pub fn matches(&self, text: &str) -> bool {
        match &self.shape {
            Shape::All => return true,
            Shape::Exact(s) => return text == s,
            Shape::Prefix(s) => return text.starts_with(s.as_str()),
            Shape::Suffix(s) => return text.ends_with(s.as_str()),
            Shape::General => {}
        }
        // `t` is a byte offset into `text`, always on a character boundary.
        let (mut t, mut p) = (0usize, 0usize);
        // Where to resume after the last `*`: (pattern index after it, text offset).
        let mut star: Option<(usize, usize)> = None;
        while let Some(c) = text[t..].chars().next() {
            match self.tokens.get(p) {
                Some(Token::AnyRun) => {
                    star = Some((p + 1, t));
                    p += 1;
                }
                Some(tok) if tok.matches_char(c) => {
                    p += 1;
                    t += c.len_utf8();
                }
                _ => match star {
                    Some((sp, st)) => {
                        let skipped = text[st..].chars().next().map_or(1, char::len_utf8);
                        p = sp;
                        t = st + skipped;
                        star = Some((sp, t));
                    }
                    None => return false,
                },
            }
        }
        self.tokens[p..].iter().all(|tok| *tok == Token::AnyRun)
    }
}

impl Glob {
    /// Whether some string matches both patterns (walks the pair of patterns
    /// as one automaton; O(len × len)).
    pub fn overlaps(&self, other: &Glob) -> bool {
        let (a, b) = (&self.tokens, &other.tokens);
        let width = b.len() + 1;
        let mut seen = vec![false; (a.len() + 1) * width];
        let mut todo = vec![(0usize, 0usize)];
        while let Some((i, j)) = todo.pop() {
            if std::mem::replace(&mut seen[i * width + j], true) {
                continue;
            }
            if i == a.len() && j == b.len() {
                return true;
            }
            let mut next = Vec::with_capacity(3);
            // A `*` may match nothing.
            if a.get(i) == Some(&Token::AnyRun) {
                next.push((i + 1, j));
            }
            if b.get(j) == Some(&Token::AnyRun) {
                next.push((i, j + 1));
            }
            // Or both consume one character they can both match.
            if let (Some(x), Some(y)) = (a.get(i), b.get(j))
                && x.shares_a_char_with(y)
            {
                let ni = if *x == Token::AnyRun { i } else { i + 1 };
                let nj = if *y == Token::AnyRun { j } else { j + 1 };
                if (ni, nj) != (i, j) {
                    next.push((ni, nj));
                }
            }
            todo.extend(next.into_iter().filter(|&(x, y)| !seen[x * width + y]));
        }
        false
    }

    /// Whether every string `other` matches is matched by this pattern too
    /// (decided exactly when this pattern is `*`, equal to `other`, or `other`
    /// is a literal; otherwise answered `false`).
    pub fn covers(&self, other: &Glob) -> bool {
        self.matches_all()
            || self.tokens == other.tokens
            || (other.is_literal() && self.matches(other.as_str_unescaped().as_str()))
    }

    /// The string a literal pattern names (escapes resolved).
    fn as_str_unescaped(&self) -> String {
        self.tokens
            .iter()
            .filter_map(|t| match t {
                Token::Literal(c) => Some(*c),
                _ => None,
            })
            .collect()
    }
}

// === impl Shape ===

impl Shape {
    fn of(tokens: &[Token]) -> Self {
        let literal = |ts: &[Token]| -> Option<String> {
            ts.iter()
                .map(|t| match t {
                    Token::Literal(c) => Some(*c),
                    _ => None,
                })
                .collect()
        };
        match tokens {
            [Token::AnyRun] => Shape::All,
            [rest @ .., Token::AnyRun] if literal(rest).is_some() => {
                Shape::Prefix(literal(rest).unwrap_or_default())
            }
            [Token::AnyRun, rest @ ..] if literal(rest).is_some() => {
                Shape::Suffix(literal(rest).unwrap_or_default())
            }
            all => literal(all).map_or(Shape::General, Shape::Exact),
        }
    }
}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Glob({:?})", self.source)
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

// === impl Token ===

impl Token {
    /// Whether some character matches both tokens (classes are never empty;
    /// a negated class is taken to share a character with any other class).
    fn shares_a_char_with(&self, other: &Token) -> bool {
        match (self, other) {
            (Token::AnyOne | Token::AnyRun, _) | (_, Token::AnyOne | Token::AnyRun) => true,
            (Token::Literal(c), t) | (t, Token::Literal(c)) => t.matches_char(*c),
            (
                Token::Class {
                    negated: false,
                    ranges: x,
                },
                Token::Class {
                    negated: false,
                    ranges: y,
                },
            ) => x
                .iter()
                .any(|(a, b)| y.iter().any(|(c, d)| a <= d && c <= b)),
            _ => true,
        }
    }

    fn matches_char(&self, c: char) -> bool {
        match self {
            Token::Literal(l) => *l == c,
            Token::AnyOne => true,
            Token::AnyRun => true,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
            }
        }
    }
}

fn parse_class(chars: &[char], open: usize) -> Result<(Token, usize), GlobError> {
    let mut i = open + 1;
    let negated = matches!(chars.get(i), Some('!') | Some('^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    loop {
        let c = *chars.get(i).ok_or(GlobError::UnclosedClass(open))?;
        match c {
            ']' => break,
            '\\' => {
                let lit = *chars.get(i + 1).ok_or(GlobError::TrailingEscape)?;
                ranges.push((lit, lit));
                i += 2;
            }
            lo => {
                if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|c| *c != ']') {
                    let hi = chars[i + 2];
                    if hi < lo {
                        return Err(GlobError::ReversedRange(lo, hi));
                    }
                    ranges.push((lo, hi));
                    i += 3;
                } else {
                    ranges.push((lo, lo));
                    i += 1;
                }
            }
        }
    }
    if ranges.is_empty() {
        return Err(GlobError::EmptyClass(open));
    }
    Ok((Token::Class { negated, ranges }, i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, t: &str) -> bool {
        Glob::new(p).expect("valid glob").matches(t)
    }

    #[test]
    fn wildcards() {
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("search_*", "search_flights"));
        assert!(!m("search_*", "research_flights"));
        assert!(m("*_admin", "db_admin"));
        assert!(m("a*b*c", "a-x-b-y-c"));
        assert!(!m("a*b*c", "a-x-b-y-d"));
        assert!(m("ech?", "echo"));
        assert!(!m("ech?", "ech"));
        assert!(m("file:///docs/*", "file:///docs/a/b.md"));
    }

    #[test]
    fn classes_and_escapes() {
        assert!(m("v[0-9]", "v7"));
        assert!(!m("v[!0-9]", "v7"));
        assert!(m("[ab]x", "bx"));
        assert!(m(r"\*", "*"));
        assert!(!m(r"\*", "x"));
    }

    #[test]
    fn literal_detection() {
        assert!(Glob::new("echo").expect("glob").is_literal());
        assert!(!Glob::new("ech*").expect("glob").is_literal());
        assert!(Glob::new("*").expect("glob").matches_all());
    }

    #[test]
    fn bad_globs_are_refused() {
        assert_eq!(Glob::new(""), Err(GlobError::Empty));
        assert_eq!(Glob::new("a[bc"), Err(GlobError::UnclosedClass(1)));
        assert_eq!(Glob::new("a[]"), Err(GlobError::EmptyClass(1)));
        assert_eq!(Glob::new("[z-a]"), Err(GlobError::ReversedRange('z', 'a')));
        assert_eq!(Glob::new("ab\\"), Err(GlobError::TrailingEscape));
    }

    #[test]
    fn shapes_match_like_the_general_walk() {
        let cases = [
            "",
            "a",
            "search_flights",
            "flights_search",
            "é",
            "séarch_x",
            "x_search",
        ];
        for pattern in [
            "*",
            "search_*",
            "*_search",
            "search_flights",
            "s*_x",
            "é*",
            "*é",
            "?",
        ] {
            let glob = Glob::new(pattern).expect("glob");
            let general = Glob {
                shape: Shape::General,
                ..glob.clone()
            };
            for text in cases {
                assert_eq!(
                    glob.matches(text),
                    general.matches(text),
                    "{pattern} vs {text}"
                );
            }
        }
    }

    #[test]
    fn multibyte_text_under_wildcards() {
        assert!(m("a*ü*z", "aßüöz"));
        assert!(m("?ö", "äö"));
        assert!(!m("a*ü*z", "aßöz"));
    }

    #[test]
    fn pathological_pattern_is_linear() {
        let p = "*a*a*a*a*a*a*a*a*a*b";
        let text = "a".repeat(5_000);
        assert!(!m(p, &text));
    }

    #[test]
    fn overlap_and_cover() {
        let g = |p: &str| Glob::new(p).expect("valid glob");
        let overlaps = |a: &str, b: &str| g(a).overlaps(&g(b)) && g(b).overlaps(&g(a));
        assert!(overlaps("*", "echo"));
        assert!(overlaps("search_*", "*_flight"));
        assert!(overlaps("search_*", "search_flights"));
        assert!(overlaps("a?c", "[ab]bc"));
        assert!(!overlaps("search_*", "get_*"));
        assert!(!overlaps("echo", "echo2"));
        assert!(!overlaps("[a-c]x", "[d-f]x"));
        assert!(overlaps("a*", "*b*c"));
        assert!(g("*").covers(&g("search_*")));
        assert!(g("search_*").covers(&g("search_flights")));
        assert!(!g("search_*").covers(&g("*_flight")));
        assert!(g("book\\*").covers(&g("book\\*")));
    }
}
