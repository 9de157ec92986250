//! The log's writer: each event, as the formatter wrote it, leaves as one
//! line of plain characters.
//!
//! Place: between the log formatter (JSON or pretty) and stderr.
//!
//! Invariants: the formatter hands over one whole event per write (it formats
//! into a buffer first); every character of it that is not plain (a control,
//! a line break, an invisible character) is escaped, but the event's final
//! LF. So no text a client or a server chose (a tool name, a method, a
//! client's name, an error quoting a body) can end the line and start one
//! that reads as the gateway's, nor drive the terminal the log is read on;
//! a JSON event stays one JSON object, the same value. Every line names the
//! replica that wrote it (`"replica"` first in a JSON event), so the logs of
//! a fleet can be told apart once gathered.

use std::io::{self, Write};

use crate::util::escape::log_line;

/// Writes events to `W`, escaped.
pub(super) struct Lines<W> {
    pub(super) inner: W,
    /// The events are JSON: escapes are JSON's.
    pub(super) json: bool,
    /// `[gateway] replica` (letters, digits, `-`, `_`, `.`: nothing to escape).
    pub(super) replica: Option<std::sync::Arc<str>>,
}

impl<W: Write> Write for Lines<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (event, end) = match text.strip_suffix('\n') {
            Some(event) => (event, "\n"),
            None => (&*text, ""),
        };
        let mut line = log_line(event, self.json).into_owned();
        if let Some(replica) = &self.replica {
            match line.strip_prefix('{') {
                Some(rest) if self.json => line = format!("{{\"replica\":\"{replica}\",{rest}"),
                _ => line = format!("{line} replica={replica}"),
            }
        }
        line.push_str(end);
        self.inner.write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_line_whatever_it_quotes() {
        let mut out = Lines {
            inner: Vec::new(),
            json: false,
            replica: None,
        };
        out.write_all(b"INFO request tool=echo\nFORGED line\x1b[2J\n")
            .expect("write");
        assert_eq!(
            String::from_utf8(out.inner).expect("UTF-8"),
            "INFO request tool=echo\\nFORGED line\\u{1b}[2J\n"
        );
    }

    #[test]
    fn a_json_event_names_its_replica_first() {
        let mut out = Lines {
            inner: Vec::new(),
            json: true,
            replica: Some("gw-1".into()),
        };
        out.write_all(b"{\"message\":\"listening\"}\n")
            .expect("write");
        let line = String::from_utf8(out.inner).expect("UTF-8");
        let v: serde_json::Value = serde_json::from_str(&line).expect("still one JSON object");
        assert_eq!(
            v,
            serde_json::json!({"replica": "gw-1", "message": "listening"})
        );
    }
}
