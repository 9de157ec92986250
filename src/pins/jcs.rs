//! RFC 8785 JSON Canonicalization Scheme (JCS): one byte sequence per JSON
//! value, whatever the key order, whitespace or number spelling it arrived in.
//!
//! Place in the path: the pin of a tool definition is the SHA-256 of this
//! serialization ([`super::digest`]); it runs on every `tools/list`.
//!
//! Rules (RFC 8785 §3.2): no whitespace; object members sorted by the UTF-16
//! code units of their names; strings escaped only where JSON requires it
//! (`"`, `\`, and U+0000–U+001F, with the two-letter forms `\b \t \n \f \r`
//! and lowercase `\u00xx` for the rest), everything else written as UTF-8;
//! numbers written as ECMAScript's `Number.prototype.toString` writes the
//! IEEE-754 double they denote (so `4.50`, `4.5` and `45e-1` are one number,
//! and integers beyond 2^53 are rounded as every JCS implementation rounds
//! them).
//!
//! Invariants: total over `serde_json::Value` (which holds no NaN or
//! infinity); never allocates per character beyond the output buffer.

use std::cmp::Ordering;
use std::fmt::Write as _;

use serde_json::{Map, Value};

/// The canonical serialization of `value`.
pub(crate) fn canonical(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write_value(&mut out, value);
    out
}

/// Appends the canonical serialization of `value` to `out`.
pub(crate) fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            // Without `arbitrary_precision` every number is an i64, u64 or f64;
            // JCS reads them all as doubles. Integers a double holds exactly
            // print the same either way.
            match n.as_i64() {
                Some(i) if i.unsigned_abs() <= 1 << 53 => {
                    let _ = write!(out, "{i}");
                }
                _ => write_number(out, n.as_f64().unwrap_or(0.0)),
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(out, map),
    }
}

fn write_object(out: &mut String, map: &Map<String, Value>) {
    let mut members: Vec<(&String, &Value)> = map.iter().collect();
    members.sort_by(|a, b| utf16_cmp(a.0, b.0));
    out.push('{');
    for (i, (key, value)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, key);
        out.push(':');
        write_value(out, value);
    }
    out.push('}');
}

/// Orders strings by their UTF-16 code units, as RFC 8785 §3.2.3 requires
/// (this differs from UTF-8 byte order for U+E000–U+FFFF against supplementary
/// characters).
fn utf16_cmp(a: &str, b: &str) -> Ordering {
    if a.is_ascii() && b.is_ascii() {
        return a.cmp(b);
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let escape = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\u{8}' => "\\b",
            '\t' => "\\t",
            '\n' => "\\n",
            '\u{c}' => "\\f",
            '\r' => "\\r",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(escape);
        }
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// ECMAScript `Number::toString(x)` for a finite double (ECMA-262 §6.1.6.1.20).
///
/// The digits are Ryu's (serde_json's float printer): the shortest that
/// round-trip, and of two equally close, the even one — as ECMAScript
/// requires (Rust's own `{:e}` breaks such ties upwards).
fn write_number(out: &mut String, x: f64) {
    if x == 0.0 || !x.is_finite() {
        // -0 is written as 0; NaN and infinities cannot occur in a JSON value.
        out.push('0');
        return;
    }
    if x < 0.0 {
        out.push('-');
    }
    let printed = serde_json::Number::from_f64(x.abs())
        .map(|n| n.to_string())
        .unwrap_or_default();
    let (digits, n) = decimal(&printed);
    let k = digits.len() as i32;
    // The value is 0.digits × 10^n.
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if n > 0 { '+' } else { '-' });
        let _ = write!(out, "{}", (n - 1).abs());
    }
}

/// `"1424953923781206.2"`, `"1e23"`, `"1.5e-7"` → significant digits and `n`
/// such that the value is `0.digits × 10^n`.
fn decimal(printed: &str) -> (String, i32) {
    let (mantissa, exponent) = printed.split_once(['e', 'E']).unwrap_or((printed, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut n = int.len() as i32 + exponent;
    let all = format!("{int}{frac}");
    let trimmed = all.trim_start_matches('0');
    n -= (all.len() - trimmed.len()) as i32;
    let digits = trimmed.trim_end_matches('0');
    if digits.is_empty() {
        return ("0".to_owned(), 1);
    }
    (digits.to_owned(), n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn number(bits: u64) -> String {
        let mut out = String::new();
        write_number(&mut out, f64::from_bits(bits));
        out
    }

    #[test]
    fn rfc8785_appendix_b_numbers() {
        let cases: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            // The RFC's table prints "1.0000000000000002e+23" here, which parses
            // to 0x44b52d02c7e14af8; V8 and Python both print this value as below.
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for (bits, expected) in cases {
            assert_eq!(number(*bits), *expected, "bits {bits:#018x}");
        }
    }

    #[test]
    fn rfc8785_section_3_2_2_example() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let value: Value = serde_json::from_str(input).expect("json");
        assert_eq!(
            canonical(&value),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn rfc8785_section_3_2_3_sorting_by_utf16_code_units() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let value: Value = serde_json::from_str(input).expect("json");
        let keys: Vec<String> = {
            let text = canonical(&value);
            let back: Map<String, Value> = serde_json::from_str(&text).expect("canonical is json");
            back.into_iter().map(|(k, _)| k).collect()
        };
        let expected = [
            "\r",
            "1",
            "\u{80}",
            "\u{f6}",
            "\u{20ac}",
            "\u{1f600}",
            "\u{fb33}",
        ];
        assert_eq!(keys, expected);
    }

    #[test]
    fn integers_and_number_spellings() {
        let spellings = ["4.5", "4.50", "45e-1", "0.45E+1"];
        for s in spellings {
            let v: Value = serde_json::from_str(s).expect("number");
            assert_eq!(canonical(&v), "4.5", "{s}");
        }
        for (s, want) in [
            ("1", "1"),
            ("1.0", "1"),
            ("-0.0", "0"),
            ("100", "100"),
            ("1e2", "100"),
            ("-17", "-17"),
            ("18446744073709551615", "18446744073709552000"),
            ("-9223372036854775808", "-9223372036854776000"),
            ("1e21", "1e+21"),
            ("1e-7", "1e-7"),
            ("123456789012345680000", "123456789012345680000"),
            ("0.1", "0.1"),
        ] {
            let v: Value = serde_json::from_str(s).expect("number");
            assert_eq!(canonical(&v), want, "{s}");
        }
    }

    #[test]
    fn strings_escape_only_what_json_requires() {
        let v = json!("a\u{0}\u{1f}\u{7f}\u{2028}\u{e0041}/é\t\"\\");
        assert_eq!(
            canonical(&v),
            "\"a\\u0000\\u001f\u{7f}\u{2028}\u{e0041}/é\\t\\\"\\\\\""
        );
        assert_eq!(canonical(&json!("\u{8}\u{c}\n\r")), r#""\b\f\n\r""#);
    }

    #[test]
    fn order_and_whitespace_do_not_matter() {
        let a: Value =
            serde_json::from_str(r#"{"b": [1, {"y": 2, "x": 1}], "a": "s"}"#).expect("json");
        let b: Value = serde_json::from_str("{\n\t\"a\":\"s\",\"b\":[1.0,{\"x\":1,\"y\":2e0}]}")
            .expect("json");
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(canonical(&a), r#"{"a":"s","b":[1,{"x":1,"y":2}]}"#);
        // Array order is meaning.
        let c: Value = serde_json::from_str(r#"{"a":"s","b":[{"x":1,"y":2},1]}"#).expect("json");
        assert_ne!(canonical(&a), canonical(&c));
    }
}
