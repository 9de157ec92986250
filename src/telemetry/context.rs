//! W3C Trace Context: reading a `traceparent` (from an HTTP header or from a
//! request's `params._meta`) and writing the one the upstream receives.
//!
//! Place in the path: at the door (the parent of the request span) and at the
//! forward stage (the upstream's parent).
//!
//! Invariants: a malformed value is ignored, never an error (a client's tracing
//! must not fail its request); ids that are all zeros are malformed; version
//! `ff` is invalid; a later version is read by its first four fields only.

use opentelemetry::trace::{SpanId, TraceId};

/// The length of a version-00 `traceparent`.
const LEN_00: usize = 55;

/// A parsed `traceparent`: whose child the next span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The trace is sampled (flag `01`): the caller records it.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` value; `None` when malformed.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let bytes = value.as_bytes();
        if bytes.len() < LEN_00 {
            return None;
        }
        let (version, trace, span, flags) = (
            value.get(0..2)?,
            value.get(3..35)?,
            value.get(36..52)?,
            value.get(53..55)?,
        );
        let dashes = [2, 35, 52].iter().all(|&i| bytes[i] == b'-');
        let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
        if !dashes || !hex(version) || version.eq_ignore_ascii_case("ff") {
            return None;
        }
        // Version 00 is exactly 55 characters; later versions may append fields.
        if (version == "00" && bytes.len() != LEN_00) || (bytes.len() > LEN_00 && bytes[55] != b'-')
        {
            return None;
        }
        if !hex(trace) || !hex(span) || !hex(flags) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok()?;
        let span_id = SpanId::from_hex(span).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        (trace_id != TraceId::INVALID && span_id != SpanId::INVALID).then_some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The version-00 text of this context.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }
}

/// The trace id of a `traceparent` value, as 32 lowercase hex digits.
pub fn trace_id(traceparent: &str) -> Option<String> {
    TraceParent::parse(traceparent).map(|p| p.trace_id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_writes_version_00() {
        let p = TraceParent::parse(VALID).expect("valid");
        assert_eq!(p.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id.to_string(), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(p.header(), VALID);
        assert!(
            !TraceParent::parse(&VALID.replace("-01", "-00"))
                .expect("valid")
                .sampled
        );
    }

    #[test]
    fn refuses_malformed_values() {
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn reads_a_later_version_by_its_known_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert_eq!(
            trace_id(later).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
    }
}
