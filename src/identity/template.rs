//! Header values built from a verified identity: a `format` around one
//! credential (`"Bearer {token}"`), and templates over the client's name and
//! its token's claims (`"{client}"`, `"{claims.email}"`).
//!
//! Place: compiled at load (`parse` refuses a placeholder it does not know),
//! rendered on each upstream request by the [`super::Broker`].
//!
//! Invariant: a rendered value is a single header line of visible ASCII —
//! every substituted value is checked by [`header_safe`] before it is
//! placed, so a claim carrying CR, LF, another control character, a
//! non-ASCII or invisible character (or nothing at all) refuses the
//! credential instead of splitting or forging a header.

use serde_json::{Map, Value};

/// Longest value one placeholder may put in a header.
pub const MAX_VALUE_BYTES: usize = 4096;

/// Why a value may not go into a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsafe {
    Empty,
    TooLong,
    /// A byte outside visible ASCII and the inner space (CR, LF, NUL, DEL,
    /// tab, any non-ASCII character), or a space at either end.
    Character,
}

impl Unsafe {
    /// In words, for an error text.
    pub fn words(self) -> &'static str {
        match self {
            Unsafe::Empty => "it is empty",
            Unsafe::TooLong => "it is longer than 4096 bytes",
            Unsafe::Character => {
                "it has a character a header cannot safely carry (a control character such as CR or LF, \
                 a non-ASCII or invisible character, or a space at either end)"
            }
        }
    }
}

/// Whether `value` may be placed in a header as it is.
pub fn header_safe(value: &str) -> Result<(), Unsafe> {
    if value.is_empty() {
        return Err(Unsafe::Empty);
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(Unsafe::TooLong);
    }
    let visible = value.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if !visible || value.starts_with(' ') || value.ends_with(' ') {
        return Err(Unsafe::Character);
    }
    Ok(())
}

/// Literal text around placeholders: visible ASCII and spaces only.
fn literal_safe(text: &str) -> bool {
    text.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// A header value with one credential placeholder, such as `"Bearer {token}"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    prefix: String,
    suffix: String,
}

impl Format {
    /// `"Bearer {token}"`.
    pub fn bearer() -> Self {
        Self {
            prefix: "Bearer ".into(),
            suffix: String::new(),
        }
    }

    /// Reads a format with exactly one `placeholder` (`{token}` or `{secret}`).
    pub fn parse(text: &str, placeholder: &str) -> Result<Self, String> {
        let (prefix, suffix) = text.split_once(placeholder).ok_or_else(|| {
            format!("the format must contain {placeholder} once, such as \"Bearer {placeholder}\"")
        })?;
        if suffix.contains(placeholder) || !literal_safe(prefix) || !literal_safe(suffix) {
            return Err(format!(
                "the format must contain {placeholder} once, around it only visible ASCII characters and spaces"
            ));
        }
        Ok(Self {
            prefix: prefix.into(),
            suffix: suffix.into(),
        })
    }

    /// The header value carrying `credential`, when it is safe to carry.
    pub fn render(&self, credential: &str) -> Result<String, Unsafe> {
        header_safe(credential)?;
        Ok(format!("{}{credential}{}", self.prefix, self.suffix))
    }
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Client,
    /// A claim, by its path (`claims.org.name` → ["org", "name"]).
    Claim(Vec<String>),
}

/// A header value over `{client}` and `{claims.NAME}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

/// Why a template could not be rendered for a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrenderable {
    /// The claim is not in the caller's token (or the caller has no token).
    Missing(String),
    /// The claim is an object, a list or null.
    NotAValue(String),
    /// A value failed [`header_safe`].
    Unsafe(String, Unsafe),
}

impl Template {
    /// Reads a template; every placeholder must be `{client}` or `{claims.NAME}`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or("a `{` is not closed; placeholders are {client} and {claims.NAME}")?;
            let name = &after[..close];
            let piece = match name.strip_prefix("claims.") {
                _ if name == "client" => Piece::Client,
                Some(path) => {
                    let parts: Vec<String> = path.split('.').map(str::to_owned).collect();
                    let valid = parts.iter().all(|p| {
                        !p.is_empty()
                            && p.bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"_-:".contains(&b))
                    });
                    if !valid {
                        return Err(format!(
                            "`{{{name}}}`: a claim is named with letters, digits, `_`, `-` and `:`, its parts joined by `.`"
                        ));
                    }
                    Piece::Claim(parts)
                }
                None => {
                    return Err(format!(
                        "`{{{name}}}` is not a placeholder; use {{client}} or {{claims.NAME}}"
                    ));
                }
            };
            pieces.push(piece);
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        let literals_ok = pieces.iter().all(|p| match p {
            Piece::Text(t) => literal_safe(t) && !t.contains('}'),
            _ => true,
        });
        if !literals_ok {
            return Err(
                "the text around placeholders must be visible ASCII characters and spaces (no stray `}`)"
                    .into(),
            );
        }
        if pieces.is_empty() {
            return Err("the template is empty".into());
        }
        Ok(Self { pieces })
    }

    /// Whether the template reads claims (so it needs a token).
    pub fn reads_claims(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Claim(_)))
    }

    /// The value for `client` with `claims` (none for an API-key client).
    pub fn render(
        &self,
        client: &str,
        claims: Option<&Map<String, Value>>,
    ) -> Result<String, Unrenderable> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Client => {
                    header_safe(client).map_err(|u| Unrenderable::Unsafe("client".into(), u))?;
                    out.push_str(client);
                }
                Piece::Claim(path) => {
                    let name = path.join(".");
                    let value = claims
                        .and_then(|c| lookup(c, path))
                        .ok_or_else(|| Unrenderable::Missing(name.clone()))?;
                    let text = match value {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        _ => return Err(Unrenderable::NotAValue(name)),
                    };
                    header_safe(&text).map_err(|u| Unrenderable::Unsafe(name, u))?;
                    out.push_str(&text);
                }
            }
        }
        // The whole line too: literals are safe, but a value at an edge may not be.
        header_safe(&out).map_err(|u| Unrenderable::Unsafe("the whole value".into(), u))?;
        Ok(out)
    }
}

fn lookup<'v>(claims: &'v Map<String, Value>, path: &[String]) -> Option<&'v Value> {
    let (first, rest) = path.split_first()?;
    let mut value = claims.get(first)?;
    for part in rest {
        value = value.as_object()?.get(part)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("object")
    }

    #[test]
    fn placeholders_are_filled_from_the_verified_identity() {
        let t = Template::parse("user={client}; mail={claims.email}; org={claims.org.id}")
            .expect("template");
        let c = claims(json!({"email": "a@example.com", "org": {"id": 7}}));
        assert_eq!(
            t.render("alice", Some(&c)).expect("renders"),
            "user=alice; mail=a@example.com; org=7"
        );
        assert_eq!(
            t.render("alice", None),
            Err(Unrenderable::Missing("email".into()))
        );
        let listed = claims(json!({"email": ["a", "b"], "org": {"id": 1}}));
        assert_eq!(
            t.render("alice", Some(&listed)),
            Err(Unrenderable::NotAValue("email".into()))
        );
    }

    #[test]
    fn unknown_or_malformed_placeholders_are_refused_at_load() {
        for bad in [
            "{user}",
            "{claims.}",
            "{claims.a b}",
            "x {client",
            "a}b",
            "",
            "caf\u{e9} {client}",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(Format::parse("Token {token} x", "{token}").is_ok());
        assert!(Format::parse("Bearer", "{token}").is_err());
        assert!(Format::parse("{token}{token}", "{token}").is_err());
        assert!(Format::parse("Bearer\r\n{token}", "{token}").is_err());
    }

    proptest! {
        /// Whatever a claim holds, a rendered value is one header line of
        /// visible ASCII, and carries the claim exactly or not at all.
        #[test]
        fn no_claim_splits_or_forges_a_header(value in any::<String>(), raw in proptest::collection::vec(any::<u8>(), 0..40)) {
            let t = Template::parse("X {claims.v}").expect("template");
            for candidate in [value, String::from_utf8_lossy(&raw).into_owned()] {
                let c = claims(json!({"v": candidate}));
                match t.render("alice", Some(&c)) {
                    Ok(out) => {
                        prop_assert_eq!(&out, &format!("X {candidate}"));
                        prop_assert!(out.bytes().all(|b| (0x20..=0x7e).contains(&b)));
                        prop_assert!(http::HeaderValue::from_str(&out).is_ok());
                    }
                    Err(Unrenderable::Unsafe(_, _)) => {
                        prop_assert!(header_safe(&candidate).is_err());
                    }
                    Err(other) => prop_assert!(false, "unexpected {other:?}"),
                }
            }
        }

        /// A credential with anything but visible ASCII is never formatted.
        #[test]
        fn a_credential_is_formatted_only_when_safe(credential in any::<String>()) {
            let f = Format::bearer();
            match f.render(&credential) {
                Ok(out) => {
                    prop_assert!(!out.contains('\r') && !out.contains('\n'));
                    prop_assert!(http::HeaderValue::from_str(&out).is_ok());
                }
                Err(_) => prop_assert!(header_safe(&credential).is_err()),
            }
        }
    }
}
