//! Server-sent events: an incremental decoder with a per-event size cap, and the
//! encoder that writes events back out.
//!
//! Place in the path: between the upstream's byte stream and the client's, so
//! each event can be inspected (and later rewritten) as it arrives, without
//! buffering the stream.
//!
//! Invariants: chunk boundaries never change the result (a line or an event
//! split across chunks decodes the same); an event larger than the cap is an
//! error, never an unbounded buffer; priming events (an `id` with empty `data`)
//! and comments survive a decode/encode round trip; one leading byte order mark
//! is dropped, as the SSE standard says.

use bytes::{BufMut, Bytes, BytesMut};

/// One item of an SSE stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SseItem {
    /// An event (dispatched at a blank line).
    Event(SseEvent),
    /// A `:` comment line, kept so keep-alives reach the client.
    Comment(String),
}

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    /// `data` lines joined with `\n`; empty for a priming event.
    pub data: String,
    pub retry: Option<u64>,
}

/// Why a stream cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SseError {
    #[error("an SSE event exceeds {0} bytes")]
    TooLarge(usize),
    #[error("the SSE stream is not UTF-8")]
    NotUtf8,
}

/// Incremental decoder.
#[derive(Debug)]
pub(crate) struct SseDecoder {
    max_event_bytes: usize,
    buffer: Vec<u8>,
    event: SseEvent,
    /// Fields seen since the last dispatch (an event with none is not dispatched).
    fields: usize,
    event_bytes: usize,
    /// Whether the stream's start has been checked for a byte order mark.
    started: bool,
}

/// The UTF-8 byte order mark a stream may start with; the SSE standard drops it.
const BOM: &[u8] = b"\xEF\xBB\xBF";

// === impl SseDecoder ===

impl SseDecoder {
    pub(crate) fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes,
            buffer: Vec::new(),
            event: SseEvent::default(),
            fields: 0,
            event_bytes: 0,
            started: false,
        }
    }

    /// Feeds one chunk; returns the items completed by it.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseItem>, SseError> {
        self.buffer.extend_from_slice(chunk);
        if !self.started {
            // Wait until the first bytes show whether they are a BOM.
            if self.buffer.len() < BOM.len() && BOM.starts_with(&self.buffer) {
                return Ok(Vec::new());
            }
            if self.buffer.starts_with(BOM) {
                self.buffer.drain(..BOM.len());
            }
            self.started = true;
        }
        let mut items = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < self.buffer.len() {
            let b = self.buffer[i];
            if b != b'\n' && b != b'\r' {
                i += 1;
                continue;
            }
            // A CR at the end of the buffer may be the first half of CRLF: wait.
            if b == b'\r' && i + 1 == self.buffer.len() {
                break;
            }
            let end = i;
            i += if b == b'\r' && self.buffer[i + 1] == b'\n' {
                2
            } else {
                1
            };
            let line = std::str::from_utf8(&self.buffer[start..end])
                .map_err(|_| SseError::NotUtf8)?
                .to_owned();
            start = i;
            if let Some(item) = self.line(&line)? {
                items.push(item);
            }
        }
        self.buffer.drain(..start);
        // A lone CR waiting for a possible LF ends a blank line: it adds nothing
        // to the event, whatever the chunking.
        let pending = if self.buffer == b"\r" {
            0
        } else {
            self.buffer.len()
        };
        if self.event_bytes + pending > self.max_event_bytes {
            return Err(SseError::TooLarge(self.max_event_bytes));
        }
        Ok(items)
    }

    /// Ends the stream: a final event without its blank line is dispatched.
    pub(crate) fn finish(&mut self) -> Result<Option<SseItem>, SseError> {
        if !self.started && BOM.starts_with(&self.buffer) {
            // Nothing but (part of) a byte order mark.
            self.buffer.clear();
        }
        if !self.buffer.is_empty() {
            let rest = std::mem::take(&mut self.buffer);
            let line = String::from_utf8(rest).map_err(|_| SseError::NotUtf8)?;
            let line = line.trim_end_matches('\r').to_owned();
            if let Some(item) = self.line(&line)? {
                return Ok(Some(item));
            }
        }
        Ok(self.dispatch())
    }

    fn line(&mut self, line: &str) -> Result<Option<SseItem>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        self.event_bytes += line.len() + 1;
        if self.event_bytes > self.max_event_bytes {
            return Err(SseError::TooLarge(self.max_event_bytes));
        }
        if let Some(comment) = line.strip_prefix(':') {
            return Ok(Some(SseItem::Comment(comment.to_owned())));
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.event_has_data() {
                    self.event.data.push('\n');
                }
                self.event.data.push_str(value);
                self.fields |= 1 << 1;
            }
            "id" if !value.contains('\0') => {
                self.event.id = Some(value.to_owned());
                self.fields |= 1;
            }
            "event" => {
                self.event.event = Some(value.to_owned());
                self.fields |= 1 << 2;
            }
            "retry" => {
                if let Ok(ms) = value.parse() {
                    self.event.retry = Some(ms);
                    self.fields |= 1 << 3;
                }
            }
            // Unknown fields are ignored, as the SSE standard says.
            _ => {}
        }
        Ok(None)
    }

    fn event_has_data(&self) -> bool {
        self.fields & (1 << 1) != 0
    }

    fn dispatch(&mut self) -> Option<SseItem> {
        self.event_bytes = 0;
        if self.fields == 0 {
            return None;
        }
        self.fields = 0;
        Some(SseItem::Event(std::mem::take(&mut self.event)))
    }
}

// === impl SseItem ===

impl SseItem {
    /// The wire form, ending with the blank line that dispatches it.
    pub(crate) fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        match self {
            SseItem::Comment(c) => {
                out.put_slice(b":");
                out.put_slice(c.as_bytes());
                out.put_slice(b"\n\n");
            }
            SseItem::Event(e) => {
                if let Some(id) = &e.id {
                    put_field(&mut out, "id", id);
                }
                if let Some(event) = &e.event {
                    put_field(&mut out, "event", event);
                }
                if let Some(retry) = e.retry {
                    put_field(&mut out, "retry", &retry.to_string());
                }
                for line in e.data.split('\n') {
                    put_field(&mut out, "data", line);
                }
                out.put_slice(b"\n");
            }
        }
        out.freeze()
    }
}

impl SseEvent {
    /// An event carrying one JSON-RPC message.
    pub(crate) fn message(data: String) -> Self {
        Self {
            data,
            ..Self::default()
        }
    }
}

fn put_field(out: &mut BytesMut, name: &str, value: &str) {
    out.put_slice(name.as_bytes());
    out.put_slice(b": ");
    // Field values cannot hold line breaks; `data` was split by the caller.
    out.put_slice(value.replace(['\r', '\n'], " ").as_bytes());
    out.put_slice(b"\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_chunks(stream: &[u8], chunk: usize) -> Vec<SseItem> {
        let mut d = SseDecoder::new(1 << 20);
        let mut items = Vec::new();
        for part in stream.chunks(chunk.max(1)) {
            items.extend(d.push(part).expect("decodes"));
        }
        items.extend(d.finish().expect("finishes"));
        items
    }

    const STREAM: &[u8] = b"id: 0\r\ndata:\r\nretry: 3000\r\n\r\n: keep-alive\n\ndata: {\"a\":1}\ndata: {\"b\":2}\n\nevent: message\rdata: last\r\r";

    #[test]
    fn decodes_the_same_whatever_the_chunking() {
        let whole = decode_in_chunks(STREAM, STREAM.len());
        assert_eq!(whole.len(), 4);
        assert_eq!(
            whole[0],
            SseItem::Event(SseEvent {
                id: Some("0".into()),
                event: None,
                data: String::new(),
                retry: Some(3000)
            })
        );
        assert_eq!(whole[1], SseItem::Comment(" keep-alive".into()));
        assert_eq!(
            whole[2],
            SseItem::Event(SseEvent::message("{\"a\":1}\n{\"b\":2}".into()))
        );
        for size in 1..STREAM.len() {
            assert_eq!(decode_in_chunks(STREAM, size), whole, "chunk size {size}");
        }
    }

    #[test]
    fn round_trips_through_encode() {
        let items = decode_in_chunks(STREAM, 7);
        let encoded: Vec<u8> = items.iter().flat_map(|i| i.encode().to_vec()).collect();
        assert_eq!(decode_in_chunks(&encoded, 3), items);
    }

    #[test]
    fn oversized_events_are_refused() {
        let mut d = SseDecoder::new(64);
        let big = format!("data: {}", "x".repeat(100));
        assert_eq!(d.push(big.as_bytes()), Err(SseError::TooLarge(64)));
        let mut d = SseDecoder::new(64);
        let many = "data: xxxxxxxxxx\n".repeat(10);
        assert_eq!(d.push(many.as_bytes()), Err(SseError::TooLarge(64)));
    }

    #[test]
    fn an_event_at_the_cap_passes_whatever_the_chunking() {
        // A 31-byte line (32 with its terminator) fills a 32-byte cap; the CR
        // that follows is a blank line, not one byte too many.
        let stream = b"data: 0123456789abcdefghijklmno\n\rdata: x\n\n";
        let whole = decode_in_chunks_max(stream, stream.len(), 32);
        assert_eq!(whole.as_ref().map(Vec::len), Ok(2));
        for size in 1..stream.len() {
            assert_eq!(
                decode_in_chunks_max(stream, size, 32),
                whole,
                "chunk size {size}"
            );
        }
    }

    fn decode_in_chunks_max(
        stream: &[u8],
        chunk: usize,
        max: usize,
    ) -> Result<Vec<SseItem>, SseError> {
        let mut d = SseDecoder::new(max);
        let mut items = Vec::new();
        for part in stream.chunks(chunk.max(1)) {
            items.extend(d.push(part)?);
        }
        items.extend(d.finish()?);
        Ok(items)
    }

    #[test]
    fn a_leading_byte_order_mark_is_dropped_whatever_the_chunking() {
        let stream = b"\xEF\xBB\xBFdata: x\n\n\xEF\xBB\xBFdata: y\n\n";
        let whole = decode_in_chunks(stream, stream.len());
        assert_eq!(whole[0], SseItem::Event(SseEvent::message("x".into())));
        // Only the stream's first BOM is special; a later one is part of a field name.
        assert_eq!(whole.len(), 1);
        for size in 1..stream.len() {
            assert_eq!(decode_in_chunks(stream, size), whole, "chunk size {size}");
        }
        assert!(decode_in_chunks(b"\xEF\xBB", 1).is_empty());
    }

    #[test]
    fn final_event_without_blank_line_is_dispatched() {
        let items = decode_in_chunks(b"data: tail", 4);
        assert_eq!(
            items,
            vec![SseItem::Event(SseEvent::message("tail".into()))]
        );
    }
}
