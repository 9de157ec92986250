//! A resource URI's query as a condition reads it: `query`, a map from each
//! parameter's name to its value.
//!
//! Place: beneath the [`super::Scope`], which converts it when a condition on
//! a resource rule first reads `query`; the text is the canonical URI's query
//! ([`crate::policy::uri::CanonicalUri::query`]), the one forwarded, so the
//! condition judges the parameters the server receives.
//!
//! Reading follows RFC 3986 as the official Python SDK's template matcher
//! does: parameters are separated by `&`, a name ends at the first `=` (a
//! pair without one has the empty value), values are percent-decoded once,
//! and empty pairs (`a=1&&b=2`) and pairs without a name (`=x`) are
//! skipped. Names are decoded once too, as FastMCP decodes them (`{?é}`
//! binds `%C3%A9=x`); the Python SDK compares them as written, but its
//! template names are ASCII letters, digits and `_`, which the canonical
//! form spells raw, so it reads the same ones. The TS SDK binds a value as forwarded (still
//! encoded): decoded once, it is the value a condition reads.
//!
//! Invariant: a condition reads a value only when every server would read
//! the same one. A query that servers read differently is refused to the
//! condition, which then fails (the use is refused, fail closed), naming the
//! cause: a parameter named twice (the Python SDK keeps the first, others the
//! last or both), a raw `+` (a space to form decoders, a plus to RFC 3986),
//! a raw `;` (a separator to legacy decoders), a raw `?` (the TS SDK's
//! matcher looks for `?name=` anywhere in the URI, so `?x?level=debug` binds
//! `level` where the query's first `?` hides it). The canonical form keeps
//! a client's `%2B`, `%3B` and `%3F` encoded, so a plus, a semicolon or a
//! question mark in a value is still sent unambiguously. A refusal quotes at
//! most [`MAX_QUOTED`] bytes of the query.

use std::borrow::Cow;
use std::collections::HashSet;

use crate::util::percent::decode;

/// One parameter: its name and its value, each decoded once.
pub type Parameter<'a> = (Cow<'a, str>, Cow<'a, str>);

/// The parameters of `query` (a canonical URI's query, without its `?`), in
/// order, names and values decoded; or why servers would read it
/// differently. One pass: each name is looked up once among those seen.
pub fn parameters(query: &str) -> Result<Vec<Parameter<'_>>, String> {
    let mut out: Vec<Parameter<'_>> = Vec::new();
    let mut seen: HashSet<Cow<'_, str>> = HashSet::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        if let Some(c) = pair.chars().find(|c| matches!(c, '+' | ';' | '?')) {
            let (reads, send) = match c {
                '+' => (
                    "a space to form decoders and a plus to RFC 3986",
                    "`%2B` for a plus, `%20` for a space",
                ),
                ';' => ("a separator to legacy decoders", "`%3B` for a semicolon"),
                _ => (
                    "where the TS SDK's matcher may find the start of the query",
                    "`%3F` for a question mark",
                ),
            };
            return Err(format!(
                "the query's `{}` holds a raw `{c}`, {reads}: servers read it differently \
                 (send {send})",
                crate::util::text::clip_to(pair, MAX_QUOTED)
            ));
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name.is_empty() {
            // No template variable has an empty name: the SDKs bind nothing.
            continue;
        }
        let name = decode(name);
        if !seen.insert(name.clone()) {
            return Err(format!(
                "the query names `{}` twice: servers read a repeated parameter differently \
                 (the first, the last or both)",
                crate::util::text::clip_to(&name, MAX_QUOTED)
            ));
        }
        out.push((name, decode(value)));
    }
    Ok(out)
}

/// Most bytes of the client's query quoted in a refusal.
const MAX_QUOTED: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn read(query: &str) -> Vec<(String, String)> {
        let got = parameters(query).unwrap_or_else(|e| panic!("{query}: {e}"));
        got.into_iter()
            .map(|(n, v)| (n.into_owned(), v.into_owned()))
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn parameters_are_read_as_the_python_sdk_reads_them() {
        assert_eq!(read(""), pairs(&[]));
        assert_eq!(read("level=warn"), pairs(&[("level", "warn")]));
        assert_eq!(
            read("a=1&&b=x%20y%2Bz&flag"),
            pairs(&[("a", "1"), ("b", "x y+z"), ("flag", "")])
        );
        assert_eq!(
            read("q=a=b"),
            pairs(&[("q", "a=b")]),
            "a name ends at the first ="
        );
        assert_eq!(
            read("q=caf%C3%A9%26more%3Bend"),
            pairs(&[("q", "café&more;end")])
        );
        assert_eq!(read("%7Ex=1"), pairs(&[("~x", "1")]), "names decoded once");
        assert_eq!(read("q=a%3Fb"), pairs(&[("q", "a?b")]), "an encoded `?`");
        assert_eq!(
            read("=x&level=1&=y"),
            pairs(&[("level", "1")]),
            "a pair without a name binds nothing"
        );
    }

    /// FastMCP decodes a parameter's name (`{?é}` binds `%C3%A9=x`), so
    /// the condition reads names decoded once too: `query['é']` is what
    /// such a server binds. The Python and TS SDKs' names are ASCII letters,
    /// digits and `_`, which the canonical form already spells raw, so they
    /// read the same names; two spellings of one name are a name twice.
    #[test]
    fn names_are_read_decoded_once() {
        assert_eq!(read("%C3%A9=x"), pairs(&[("é", "x")]));
        assert_eq!(
            read("my%20name=x&a%2Cb=y"),
            pairs(&[("my name", "x"), ("a,b", "y")])
        );
        let why = parameters("a%2Cb=1&a,b=2").expect_err("one name, two spellings");
        assert!(why.contains("names `a,b` twice"), "{why}");
    }

    /// The TS SDK matches `{?level}` as `\?level=` anywhere in the URI, so
    /// after a raw `?` inside the query it finds a parameter the query's
    /// first `?` hides: `logs://api?x?level=debug` binds `level` there.
    #[test]
    fn a_raw_question_mark_in_the_query_is_refused() {
        for query in ["x?level=debug", "level=warn?level=debug", "a=1&?level=2"] {
            let why = parameters(query).expect_err(query);
            assert!(why.contains("raw `?`"), "{query}: {why}");
        }
    }

    /// However many parameters a query has, each is compared once: the
    /// longest URI a request may carry, in parameters of distinct names.
    #[test]
    fn many_parameters_are_read_in_one_pass() {
        let names: Vec<String> = (0..20_000).map(|i| format!("p{i}")).collect();
        let query = names.join("&");
        let read = parameters(&query).expect("distinct names");
        assert_eq!(read.len(), names.len());
        let twice = format!("{query}&p0");
        assert!(
            parameters(&twice)
                .expect_err("p0 twice")
                .contains("`p0` twice")
        );
    }

    #[test]
    fn a_query_servers_read_differently_is_refused_with_its_cause() {
        for (query, words) in [
            ("a=1&a=2", "names `a` twice"),
            ("a=1&b=2&a", "names `a` twice"),
            ("a=x+y", "raw `+`"),
            ("a=x;b=y", "raw `;`"),
            ("a+b=1", "raw `+`"),
        ] {
            let why = parameters(query).expect_err(query);
            assert!(why.contains(words), "{query}: {why}");
        }
    }
}
