//! Durations as operators write them: `"30s"`, `"250ms"`, `"7d"`, `"1h30m"`.
//!
//! Invariants: a unit is mandatory (a bare `30` is ambiguous), the total must
//! fit in a `Duration`, and the result is never negative.

use std::time::Duration;

/// The sentence shown when a duration cannot be read.
pub(crate) const EXPECTED: &str = "expected a duration such as \"30s\", \"250ms\", \"5m\", \"2h\" or \"7d\" (units: ms, s, m, h, d)";

/// Parses a duration string; `Err` carries the reason.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("the duration is empty; {EXPECTED}"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("{text:?} is not a duration; {EXPECTED}"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{text:?} is too large; {EXPECTED}"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => value
                .checked_mul(60)
                .map(Duration::from_secs)
                .unwrap_or(Duration::MAX),
            "h" => value
                .checked_mul(3_600)
                .map(Duration::from_secs)
                .unwrap_or(Duration::MAX),
            "d" => value
                .checked_mul(86_400)
                .map(Duration::from_secs)
                .unwrap_or(Duration::MAX),
            "" => return Err(format!("{text:?} has no unit; {EXPECTED}")),
            other => {
                return Err(format!(
                    "{text:?} has an unknown unit {other:?}; {EXPECTED}"
                ));
            }
        };
        total = total
            .checked_add(part)
            .filter(|d| *d < Duration::MAX)
            .ok_or_else(|| format!("{text:?} is too large; {EXPECTED}"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_documented_forms() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5_400)));
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            "",
            "30",
            "s",
            "10 seconds",
            "-1s",
            "1.5s",
            "99999999999999999999d",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
