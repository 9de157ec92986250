//! The canonical form of a resource URI: the one spelling rules, rate-limit
//! keys, the merged view's routing and the upstream all see.
//!
//! Place in the path: `resources/read`, `resources/subscribe` and
//! `resources/unsubscribe` canonicalize `params.uri` before anything is
//! decided; the resource list is filtered on the canonical form of each listed
//! URI; the merged `/mcp` view routes on it; `[[rules]] resources` patterns are
//! checked against it at load ([`pattern`]). Pure: no I/O.
//!
//! The form (RFC 3986 §6.2.2, tightened where the official SDKs read a URI
//! differently from the RFC):
//! - the scheme is lowercased; a URI without one is refused;
//! - the host (the part between `scheme://` and the next `/`, after any
//!   `userinfo@`) is lowercased for every scheme, as RFC 3986 §3.2.2 says
//!   hosts are. The Python SDK reads `users://Admin/profile` as the variable
//!   `Admin`; the gateway forwards the lowercase spelling, so the server
//!   resolves what was decided. An empty port (`host:`) is dropped;
//! - an escape of an unreserved character (`%41` → `A`, `%7E` → `~`; `%2E` is
//!   refused, below, as servers that decode it find dot segments) and of
//!   the sub-delimiters no SDK template reads as structure (`! $ ' ( ) * +`,
//!   and `: @` outside the authority) is decoded; every other escape keeps
//!   uppercase hex; a raw character a URI may not carry (space, non-ASCII,
//!   `" < > ^ \` { | } [ ]` outside a host) is percent-encoded as UTF-8, so
//!   `josé` and `jos%C3%A9` are one spelling;
//! - dot segments are removed (§5.2.4) and empty segments collapsed
//!   (`a//b` → `a/b`); a trailing `/` stays;
//! - the fragment is dropped (it is checked first, like everything else), and
//!   so is an empty query (`x?` is `x`).
//!
//! The query is kept (normalized the same way; `%26`, `%3D`, `%2B`, `%3B`,
//! `%3F` and `%2C` kept as they are query structure to some reader: a
//! separator, a pair, a form decoder's space, a legacy separator, the TS
//! SDK's start of a query, a list's separator; a raw `?` in it is encoded as
//! `%3F`, which every query decoder reads as the `?` it was) and
//! forwarded, but it is not part of the resource's
//! [`CanonicalUri::identity`]: rules' patterns and rate-limit buckets see the
//! URI without its query (`logs://api?x=1` is `logs://api`), and a rule's
//! condition reads the query's parameters as `query`, taken from this same
//! canonical text, so what is judged is what is forwarded.
//!
//! Refused, whatever the rules say ([`UriRefusal`]): an escape whose decoding
//! would change the URI's structure (`%2F`, `%5C`, `%2E`, `%23`, and in the
//! path or authority `%3F`, `%2C`, `%26`, `%3B`, `%3D`, in the authority
//! `%3A`, `%40`, and in the host `%5B`, `%5D`), a raw `\`, double encoding (text that still
//! reads as an escape once decoded: `%252e`, `%25%32%65`), an invalid escape,
//! escapes that do not decode to UTF-8, a NUL or any other control character
//! (C0, DEL, C1) raw or encoded, a `..` that climbs above the root, a `.` or
//! `..` between `/` in the query (the TS SDK reads a query into a template's
//! last path variable when the template names none, so
//! `file:///{+path}` binds `public?/../secret`, a path that climbs), and an
//! authority that is `.` or `..` or has two `@`.
//!
//! Invariants: [`canonical`] is idempotent (the canonical form of a canonical
//! URI is itself); it never yields a URI that carries an encoded `/` or `\`,
//! a dot segment (in its path or, between `/`, its query), an empty
//! segment, a control character or a fragment.

use std::fmt;

use crate::util::percent::{hex_pair, hex_pair_at, push_escape};

/// A URI in canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalUri {
    text: String,
    /// Where the query starts (`?`), if there is one.
    query: Option<usize>,
}

/// Why a URI is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriRefusal {
    /// The empty string.
    #[error("the URI is empty")]
    Empty,
    /// No `scheme:` in front.
    #[error("the URI has no scheme; a resource URI is absolute, such as `file:///path`")]
    NoScheme,
    /// A `%` not followed by two hex digits.
    #[error("`{0}` is not a valid percent-escape (a `%` is followed by two hex digits)")]
    InvalidEscape(String),
    /// An escape whose decoding would change the URI's structure.
    #[error(
        "`{escape}` encodes `{decoded}`, which would change the URI's structure once decoded; write the URI without it"
    )]
    EncodedDelimiter {
        /// The escape as written.
        escape: String,
        /// What it encodes.
        decoded: char,
    },
    /// An escape that, once decoded, reads as another escape (`%252e`).
    #[error(
        "the URI is encoded twice: it decodes to `{0}`, itself an escape; send the URI encoded once"
    )]
    DoubleEncoding(String),
    /// A raw backslash.
    #[error("the URI contains `\\`, which some servers read as `/`")]
    Backslash,
    /// A control character, raw or encoded.
    #[error("the URI contains the control character U+{0:04X}")]
    Control(u32),
    /// Escapes that do not decode to UTF-8.
    #[error("the percent-escapes of the URI do not decode to UTF-8 text")]
    NotUtf8,
    /// A `..` with nothing left to remove.
    #[error("a `..` segment climbs above the root of the URI's path")]
    AboveRoot,
    /// A `.` or `..` between `/` in the query: a matcher that reads the
    /// query into a path variable (the TS SDK's) would climb with it.
    #[error(
        "the query has a `.` or `..` segment, which a server that reads the query into the path would resolve; encode the value without it"
    )]
    QueryDotSegment,
    /// `scheme://./…` or `scheme://../…`.
    #[error("the authority `{0}` is a dot segment")]
    DotAuthority(String),
    /// `user@name@host`: servers disagree on where the host begins.
    /// The authority is quoted escaped (`{0:?}`): it is the client's raw text.
    #[error("the authority {0:?} has more than one `@`; servers disagree on where its host begins")]
    TwoAts(String),
    /// A `.` or `..` segment in a rule's pattern.
    #[error(
        "the segment `{0}` never occurs in a canonical URI (dot segments are resolved before rules see it)"
    )]
    DotSegment(String),
    /// A `#` in a rule's pattern.
    #[error("a resource URI is decided without its fragment, so a pattern with `#` never matches")]
    Fragment,
}

/// The parts of a URI, which decode differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Userinfo,
    Host,
    Path,
    Query,
    Fragment,
}

/// What an escape of one byte becomes in a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    Decode,
    Keep,
    Refuse,
}

// === impl CanonicalUri ===

impl CanonicalUri {
    /// The whole canonical URI, query included: what is forwarded upstream.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The query, without its `?` (empty when there is none): what a
    /// condition reads as `query` (see [`super::expression::query`]).
    pub fn query(&self) -> &str {
        match self.query {
            Some(q) => &self.text[q + 1..],
            None => "",
        }
    }

    /// The resource the URI names: the canonical URI without its query. Rules
    /// and rate-limit keys see this.
    pub fn identity(&self) -> &str {
        match self.query {
            Some(q) => &self.text[..q],
            None => &self.text,
        }
    }
}

impl fmt::Display for CanonicalUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The canonical form of `uri`, or why it is refused.
pub fn canonical(uri: &str) -> Result<CanonicalUri, UriRefusal> {
    if uri.is_empty() {
        return Err(UriRefusal::Empty);
    }
    check_raw(uri)?;
    let (scheme, rest) = split_scheme(uri).ok_or(UriRefusal::NoScheme)?;
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    if let Some(fragment) = fragment {
        // Checked like the rest, then dropped.
        normalize(fragment, Part::Fragment, &mut String::new())?;
    }
    // An empty query is none: every SDK reads `x?` as `x`, but the TS SDK's
    // matcher would bind `x?` to a template's last variable.
    let (hier, query) = match rest.split_once('?') {
        Some((h, q)) => (h, Some(q).filter(|q| !q.is_empty())),
        None => (rest, None),
    };
    let mut text = String::with_capacity(uri.len() + 8);
    text.push_str(&scheme.to_ascii_lowercase());
    text.push(':');
    let path = match hier.strip_prefix("//") {
        Some(after) => {
            let end = after.find('/').unwrap_or(after.len());
            text.push_str("//");
            authority(&after[..end], &mut text)?;
            &after[end..]
        }
        None => hier,
    };
    let mut normalized = String::with_capacity(path.len());
    normalize(path, Part::Path, &mut normalized)?;
    segments(&normalized, &mut text)?;
    let query = match query {
        Some(q) => {
            let at = text.len();
            text.push('?');
            normalize(q, Part::Query, &mut text)?;
            // A matcher that reads the query into the path's last variable
            // (the TS SDK's, for a template without a query) must find no
            // dot segment there; the query's first piece joins that
            // variable's last segment, so it never is one.
            if text[at + 1..]
                .split('/')
                .skip(1)
                .any(|s| s == "." || s == "..")
            {
                return Err(UriRefusal::QueryDotSegment);
            }
            Some(at)
        }
        None => None,
    };
    Ok(CanonicalUri { text, query })
}

/// Checks a `[[rules]] resources` pattern: `Ok(same)` when it is canonical,
/// `Ok(other)` with the canonical spelling an operator should write instead,
/// or why no URI could ever match it. Glob characters (`*`, `?`, `[…]`, `\x`)
/// pass through untouched; everything else is held to [`canonical`]'s form.
pub fn pattern(glob: &str) -> Result<String, UriRefusal> {
    if glob.contains('#') {
        return Err(UriRefusal::Fragment);
    }
    let mut out = String::with_capacity(glob.len());
    // The scheme, when the pattern spells one out.
    let rest = match split_scheme(glob) {
        Some((scheme, rest)) => {
            out.push_str(&scheme.to_ascii_lowercase());
            out.push(':');
            rest
        }
        None => glob,
    };
    let (authority, path) = match rest.strip_prefix("//") {
        Some(after) => {
            let end = after.find('/').unwrap_or(after.len());
            (Some(&after[..end]), &after[end..])
        }
        None => (None, rest),
    };
    if let Some(authority) = authority {
        out.push_str("//");
        let host = match authority.rsplit_once('@') {
            Some((userinfo, _)) if userinfo.contains('@') => {
                return Err(UriRefusal::TwoAts(authority.to_owned()));
            }
            Some((userinfo, host)) => {
                pattern_text(userinfo, Part::Userinfo, &mut out)?;
                out.push('@');
                host
            }
            None => authority,
        };
        let mut normalized = String::new();
        pattern_text(host, Part::Host, &mut normalized)?;
        out.push_str(&lowercase_outside_escapes(&normalized));
    }
    let mut normalized = String::new();
    pattern_text(path, Part::Path, &mut normalized)?;
    // Dot and empty segments never occur in a canonical URI: a dot segment is
    // refused, a run of `/` collapsed in the suggestion.
    let mut last_slash = false;
    for c in normalized.chars() {
        if c == '/' && last_slash {
            continue;
        }
        last_slash = c == '/';
        out.push(c);
    }
    if let Some(segment) = out
        .split('/')
        .skip(if authority.is_some() { 3 } else { 1 })
        .find(|s| *s == "." || *s == "..")
    {
        return Err(UriRefusal::DotSegment(segment.to_owned()));
    }
    Ok(out)
}

/// Normalizes the escapes of a pattern's text, leaving glob syntax alone.
fn pattern_text(text: &str, part: Part, out: &mut String) -> Result<(), UriRefusal> {
    let mut plain = String::new();
    let mut chars = text.chars().peekable();
    let flush = |plain: &mut String, out: &mut String| -> Result<(), UriRefusal> {
        if !plain.is_empty() {
            check_raw(plain)?;
            normalize(plain, part, out)?;
            plain.clear();
        }
        Ok(())
    };
    while let Some(c) = chars.next() {
        match c {
            '*' | '?' => {
                flush(&mut plain, out)?;
                out.push(c);
            }
            '\\' => {
                flush(&mut plain, out)?;
                out.push(c);
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            '[' => {
                flush(&mut plain, out)?;
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == ']' {
                        break;
                    }
                }
            }
            // Templates list `{var}` raw; a pattern may name them as written.
            '{' | '}' => {
                flush(&mut plain, out)?;
                out.push(c);
            }
            _ => plain.push(c),
        }
    }
    flush(&mut plain, out)
}

/// Lowercases letters, but not the hex digits of `%XX` escapes.
fn lowercase_outside_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut hex = 0;
    for c in text.chars() {
        if hex > 0 {
            hex -= 1;
            out.push(c);
        } else if c == '%' {
            hex = 2;
            out.push(c);
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// `scheme` and what follows its `:`, when `text` starts with a valid scheme.
fn split_scheme(text: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = text.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some((scheme, rest))
}

/// Refuses raw controls and backslashes.
fn check_raw(text: &str) -> Result<(), UriRefusal> {
    for c in text.chars() {
        if is_control(c) {
            return Err(UriRefusal::Control(c as u32));
        }
        if c == '\\' {
            return Err(UriRefusal::Backslash);
        }
    }
    Ok(())
}

/// C0, DEL and C1: what a log line, a terminal or a C string would read differently.
fn is_control(c: char) -> bool {
    c.is_control()
}

/// `userinfo@host:port`, with the host lowercased.
fn authority(raw: &str, out: &mut String) -> Result<(), UriRefusal> {
    let (userinfo, host_port) = match raw.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, raw),
    };
    if let Some(userinfo) = userinfo {
        if userinfo.contains('@') {
            return Err(UriRefusal::TwoAts(raw.to_owned()));
        }
        normalize(userinfo, Part::Userinfo, out)?;
        out.push('@');
    }
    // An IP literal keeps its colons inside the brackets.
    let split_at = match host_port.strip_prefix('[') {
        Some(_) => host_port
            .find(']')
            .and_then(|end| host_port[end..].find(':').map(|i| end + i)),
        None => host_port.find(':'),
    };
    let (host, port) = match split_at {
        Some(i) => (&host_port[..i], Some(&host_port[i + 1..])),
        None => (host_port, None),
    };
    let mut normalized = String::with_capacity(host.len());
    normalize(host, Part::Host, &mut normalized)?;
    let host = lowercase_outside_escapes(&normalized);
    if host == "." || host == ".." {
        return Err(UriRefusal::DotAuthority(host));
    }
    out.push_str(&host);
    if let Some(port) = port.filter(|p| !p.is_empty()) {
        // Digits in a URL; text to a template that reads the authority as a
        // variable: folded like the host, so `h:X` and `h:x` are one.
        let mut normalized = String::with_capacity(port.len());
        normalize(port, Part::Host, &mut normalized)?;
        out.push(':');
        out.push_str(&lowercase_outside_escapes(&normalized));
    }
    Ok(())
}

/// Removes dot segments (§5.2.4) and collapses empty ones; a `..` with
/// nothing left to remove is refused.
fn segments(path: &str, out: &mut String) -> Result<(), UriRefusal> {
    if path.is_empty() {
        return Ok(());
    }
    let rooted = path.starts_with('/');
    let mut kept: Vec<&str> = Vec::new();
    let mut trailing = path.ends_with('/');
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    for (i, segment) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        match *segment {
            "." => trailing |= last,
            ".." => {
                kept.pop().ok_or(UriRefusal::AboveRoot)?;
                trailing |= last;
            }
            s => kept.push(s),
        }
    }
    if rooted {
        out.push('/');
    }
    out.push_str(&kept.join("/"));
    if trailing && !kept.is_empty() {
        out.push('/');
    }
    Ok(())
}

/// Appends `text` with its escapes normalized for `part` (see the module
/// header), after checking that everything it encodes is UTF-8 text without
/// control characters.
fn normalize(text: &str, part: Part, out: &mut String) -> Result<(), UriRefusal> {
    let bytes = text.as_bytes();
    // First the whole decoded text: UTF-8, no controls.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = hex_pair(bytes, i).ok_or_else(|| {
                let end = (i + 3).min(bytes.len());
                UriRefusal::InvalidEscape(String::from_utf8_lossy(&bytes[i..end]).into_owned())
            })?;
            decoded.push(byte);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    let decoded = String::from_utf8(decoded).map_err(|_| UriRefusal::NotUtf8)?;
    if let Some(c) = decoded.chars().find(|c| is_control(*c)) {
        return Err(UriRefusal::Control(c as u32));
    }
    // Decoded once, the text must not read as an escape again (`%252e`,
    // `%25%32%65`): a server that decodes twice would see another URI.
    if let Some(at) = decoded
        .bytes()
        .enumerate()
        .position(|(i, b)| b == b'%' && hex_pair_at(decoded.as_bytes(), i + 1))
    {
        return Err(UriRefusal::DoubleEncoding(decoded[at..at + 3].to_owned()));
    }
    // Then each escape and character, in the canonical spelling.
    let mut i = 0;
    while i < text.len() {
        if bytes[i] == b'%' {
            let byte = hex_pair(bytes, i).unwrap_or_default();
            let escape = &text[i..i + 3];
            match escape_rule(byte, part) {
                Escape::Decode => out.push(byte as char),
                Escape::Keep => push_escape(out, byte),
                Escape::Refuse => {
                    return Err(UriRefusal::EncodedDelimiter {
                        escape: escape.to_owned(),
                        decoded: byte as char,
                    });
                }
            }
            i += 3;
        } else {
            let c = text[i..].chars().next().unwrap_or_default();
            if raw_allowed(c, part) {
                out.push(c);
            } else {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    push_escape(out, b);
                }
            }
            i += c.len_utf8();
        }
    }
    Ok(())
}

/// What an escape of `byte` becomes in `part`.
fn escape_rule(byte: u8, part: Part) -> Escape {
    let authority = matches!(part, Part::Userinfo | Part::Host);
    match byte {
        // Structure everywhere: a segment, a Windows separator, a dot segment, a fragment.
        b'/' | b'\\' | b'.' | b'#' => Escape::Refuse,
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => Escape::Decode,
        // In a query, form decoders read `+` as a space and older ones split
        // at `;`: an escape of either stays, so a client's plus or semicolon
        // reaches every server as the value it sent (see `query`).
        // So does `?`: the TS SDK's matcher may take a later `?` for the
        // start of the query (`?x?level=` binds `level`); and `,`: a list
        // parameter splits at a raw one only (RFC 6570 §3.2.8, FastMCP).
        b'+' | b';' | b'?' | b',' if part == Part::Query => Escape::Keep,
        // Never structure to the SDKs' template matchers.
        b'!' | b'$' | b'\'' | b'(' | b')' | b'*' | b'+' => Escape::Decode,
        b':' | b'@' if authority => Escape::Refuse,
        b'[' | b']' if part == Part::Host => Escape::Refuse,
        b':' | b'@' => Escape::Decode,
        // Separators of template variables (`{var}` stops at `,` `&`; `{;var}`
        // at `;` `=`; a query starts at `?`): raw and encoded differ there.
        b'?' | b',' | b';' if part == Part::Query || part == Part::Fragment => Escape::Decode,
        b'?' | b',' | b'&' | b';' | b'=' if part != Part::Query && part != Part::Fragment => {
            Escape::Refuse
        }
        _ => Escape::Keep,
    }
}

/// Whether `c` may stand raw in `part` (else it is percent-encoded).
fn raw_allowed(c: char, part: Part) -> bool {
    let unreserved = c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~');
    let sub_delim = matches!(
        c,
        '!' | '$' | '&' | '\'' | '(' | ')' | '*' | '+' | ',' | ';' | '='
    );
    unreserved
        || sub_delim
        || match part {
            Part::Userinfo => c == ':',
            Part::Host => matches!(c, '[' | ']' | ':'),
            Part::Path => matches!(c, ':' | '@' | '/'),
            // A `?` inside the query is sent encoded: the TS SDK's matcher
            // may take it for the query's start and bind what precedes it
            // into the path's last variable (`logs://api?x?level=` binds
            // `service` to `api?x`); every query decoder reads `%3F` as `?`.
            Part::Query => matches!(c, ':' | '@' | '/'),
            Part::Fragment => matches!(c, ':' | '@' | '/' | '?'),
        }
}

#[cfg(test)]
mod tests;
