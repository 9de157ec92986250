//! Percent-escapes (`%XX`, RFC 3986 §2.1): reading one, writing one, and
//! decoding a text's escapes once.
//!
//! Place in the path: a leaf, used by the canonical form of resource URIs
//! (`policy::uri`) and by the reading of a URI's query in conditions
//! (`policy::expression::query`), so both read an escape the same way.
//! Invariants: an escape is written with uppercase hex; [`decode`] decodes
//! each escape exactly once and leaves the text as written when the bytes
//! it would give are not UTF-8.

use std::borrow::Cow;

/// The byte the escape starting at `bytes[at]` (the `%`) encodes, if two
/// hex digits follow it.
pub fn hex_pair(bytes: &[u8], at: usize) -> Option<u8> {
    let hi = (*bytes.get(at + 1)? as char).to_digit(16)?;
    let lo = (*bytes.get(at + 2)? as char).to_digit(16)?;
    Some((hi * 16 + lo) as u8)
}

/// Whether `bytes[at..]` starts with two hex digits.
pub fn hex_pair_at(bytes: &[u8], at: usize) -> bool {
    bytes.len() >= at + 2 && bytes[at].is_ascii_hexdigit() && bytes[at + 1].is_ascii_hexdigit()
}

/// Appends the escape of `byte`, in uppercase hex.
pub fn push_escape(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(HEX[usize::from(byte >> 4)] as char);
    out.push(HEX[usize::from(byte & 0xF)] as char);
}

/// `text` with each escape decoded once (a `%` not followed by two hex
/// digits stays as it is); `text` as written when the decoded bytes are not
/// UTF-8.
pub fn decode(text: &str) -> Cow<'_, str> {
    if !text.contains('%') {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex_pair(bytes, i)) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    match String::from_utf8(out) {
        Ok(decoded) => Cow::Owned(decoded),
        Err(_) => Cow::Borrowed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_are_read_and_written_alike() {
        assert_eq!(decode("a%20b%2Bc%2bd"), "a b+c+d");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz%4"), "%zz%4");
        assert_eq!(decode("%FF"), "%FF", "not UTF-8: kept as written");
        assert_eq!(decode("%252e"), "%2e", "once, not twice");
        let mut s = String::new();
        push_escape(&mut s, 0xc3);
        push_escape(&mut s, 0x0a);
        assert_eq!(s, "%C3%0A");
    }

    proptest! {
        /// Any text written as escapes byte by byte decodes back to itself.
        #[test]
        fn an_escaped_text_decodes_to_itself(text in ".{0,40}") {
            let mut escaped = String::new();
            for b in text.bytes() {
                push_escape(&mut escaped, b);
            }
            prop_assert_eq!(decode(&escaped), text.as_str());
        }
    }
}
