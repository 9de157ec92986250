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
//! pair without one has the empty value), names are compared as written
//! (the canonical form has already decoded what may be decoded), values are
//! percent-decoded once, and empty pairs (`a=1&&b=2`) are skipped.
//!
//! Invariant: a condition reads a value only when every server would read
//! the same one. A query that servers read differently is refused to the
//! condition, which then fails (the use is refused, fail closed), naming the
//! cause: a parameter named twice (the Python SDK keeps the first, others the
//! last or both), a raw `+` (a space to form decoders, a plus to RFC 3986),
//! a raw `;` (a separator to legacy decoders). The canonical form keeps a
//! client's `%2B` and `%3B` encoded, so a plus or a semicolon in a value
//! is still sent unambiguously.

use std::borrow::Cow;

/// The parameters of `query` (a canonical URI's query, without its `?`), in
/// order, values decoded; or why servers would read it differently.
pub fn parameters(query: &str) -> Result<Vec<(&str, Cow<'_, str>)>, String> {
    let mut out: Vec<(&str, Cow<'_, str>)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        if let Some(c) = pair.chars().find(|c| matches!(c, '+' | ';')) {
            let (reads, send) = match c {
                '+' => (
                    "a space to form decoders and a plus to RFC 3986",
                    "`%2B` for a plus, `%20` for a space",
                ),
                _ => ("a separator to legacy decoders", "`%3B` for a semicolon"),
            };
            return Err(format!(
                "the query's `{pair}` holds a raw `{c}`, {reads}: servers read it differently \
                 (send {send})"
            ));
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if out.iter().any(|(n, _)| *n == name) {
            return Err(format!(
                "the query names `{name}` twice: servers read a repeated parameter differently \
                 (the first, the last or both)"
            ));
        }
        out.push((name, decode(value)));
    }
    Ok(out)
}

/// `value` with its escapes decoded. The canonical form leaves only escapes
/// of UTF-8 text, so the decoding never fails; should it ever meet another,
/// the escape is kept as written.
fn decode(value: &str) -> Cow<'_, str> {
    if !value.contains('%') {
        return Cow::Borrowed(value);
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| (*bytes.get(at)? as char).to_digit(16);
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    match String::from_utf8(out) {
        Ok(decoded) => Cow::Owned(decoded),
        Err(_) => Cow::Borrowed(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(query: &str) -> Vec<(String, String)> {
        let got = parameters(query).unwrap_or_else(|e| panic!("{query}: {e}"));
        got.into_iter()
            .map(|(n, v)| (n.to_owned(), v.into_owned()))
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
        assert_eq!(read("%7Ex=1"), pairs(&[("%7Ex", "1")]), "names as written");
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
