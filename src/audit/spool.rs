//! The audit spool of a fleet replica: an append-only file of events, one
//! JSON line each, written before the answer leaves and shipped from there
//! to PostgreSQL by [`super::postgres`].
//!
//! Place: under the audit store, between the request path (which appends)
//! and the shipper (which reads, ships and trims). Invariants: a line is
//! appended with one `write(2)` on a file opened `O_APPEND`, so once the call
//! returns the kernel holds it even if the process is killed (`kill -9`);
//! a line never contains a newline (JSON escapes control characters), so a
//! torn tail is recognised by its missing newline and cut at the next open;
//! the shipped offset is kept beside the spool and only ever trails what is
//! in the database (rows carry a unique key, so shipping a line twice after
//! a crash inserts it once); at most `capacity` unshipped events are kept,
//! past that an event is dropped and counted, never silently; a spool has one
//! writer: it is locked (`flock`) for the process that opened it, and a
//! second opener is refused before it reads or cuts anything (two writers
//! would each count only their own bytes, and one emptying the file would
//! take the other's unshipped events with it).

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::record::event::Event;

/// One spooled row: the event and who wrote it, under a key unique to it.
#[derive(Debug, Serialize)]
pub(crate) struct Row<'a> {
    /// `replica:pid:start_ms:seq`: unique per event of the fleet.
    pub key: &'a str,
    pub replica: &'a str,
    #[serde(flatten)]
    pub event: &'a Event,
}

/// The JSON line of `row`, with its newline.
pub(crate) fn encode(row: &Row<'_>) -> Vec<u8> {
    let mut line = serde_json::to_vec(row).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The append side and the shipped offset.
#[derive(Debug)]
struct Tail {
    file: File,
    /// Bytes in the file.
    len: u64,
}

/// The spool file and its offset file.
#[derive(Debug)]
pub(crate) struct Spool {
    tail: Mutex<Tail>,
    /// Bytes already in the database.
    shipped: AtomicU64,
    /// Events appended and not yet shipped.
    pending: AtomicU64,
    offset_path: PathBuf,
    path: PathBuf,
}

impl Spool {
    /// Opens (creating) the spool at `path`: cuts a torn last line, reads the
    /// shipped offset and counts what the previous run left unshipped.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)?;
        // Before anything is read or cut: the tail may be another
        // process's write under way.
        hold(&file)?;
        let mut len = file.metadata()?.len();
        let whole = read_range(&file, 0, len)?;
        let kept = whole.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) as u64;
        if kept < len {
            // A line cut by a kill during its write: it was never whole, so
            // never appended (the answer it belongs to had not left).
            file.set_len(kept)?;
            len = kept;
        }
        let offset_path = path.with_extension("offset");
        let shipped = std::fs::read_to_string(&offset_path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&o| o <= len && (o == 0 || whole.get(o as usize - 1) == Some(&b'\n')))
            .unwrap_or(0);
        let pending = whole[shipped as usize..len as usize]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        Ok(Self {
            tail: Mutex::new(Tail { file, len }),
            shipped: AtomicU64::new(shipped),
            pending: AtomicU64::new(pending),
            offset_path,
            path: path.to_owned(),
        })
    }

    /// Where the spool is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Events appended and not yet shipped.
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// Appends one encoded line (see [`encode`]) with one write.
    pub(crate) fn append(&self, line: &[u8]) -> io::Result<()> {
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.file.write_all(line)?;
        tail.len += line.len() as u64;
        self.pending.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Up to `max` whole unshipped lines (without their newlines), and the
    /// offset just past the last one.
    pub(crate) fn unshipped(&self, max: usize) -> io::Result<(Vec<Vec<u8>>, u64)> {
        let (file, len) = {
            let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
            (tail.file.try_clone()?, tail.len)
        };
        let from = self.shipped.load(Ordering::Acquire);
        // At most 4 MiB a read: a batch, not the whole backlog of an outage.
        let to = len.min(from + 4 * 1024 * 1024);
        let bytes = read_range(&file, from, to)?;
        let mut lines = Vec::new();
        let mut end = from;
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            if lines.len() == max || line.last() != Some(&b'\n') {
                break;
            }
            end += line.len() as u64;
            lines.push(line[..line.len() - 1].to_vec());
        }
        if lines.is_empty() && to < len && to > from {
            // One line longer than a read: take it whole.
            let rest = read_range(&file, from, len)?;
            if let Some(i) = rest.iter().position(|&b| b == b'\n') {
                lines.push(rest[..i].to_vec());
                end = from + i as u64 + 1;
            }
        }
        Ok((lines, end))
    }

    /// Marks `events` lines up to `offset` as in the database; empties the
    /// file when everything appended is shipped.
    pub(crate) fn shipped(&self, offset: u64, events: u64) {
        self.shipped.store(offset, Ordering::Release);
        self.pending.fetch_sub(events, Ordering::Relaxed);
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let mut at = offset;
        if tail.len == offset && offset > 0 && tail.file.set_len(0).is_ok() {
            tail.len = 0;
            at = 0;
            self.shipped.store(0, Ordering::Release);
        }
        drop(tail);
        if let Err(e) = std::fs::write(&self.offset_path, at.to_string()) {
            tracing::warn!(error = %e, "cannot note the audit spool's shipped offset");
        }
    }
}

/// Holds `file` for this process until it is closed (the kernel lets go
/// when the process ends, however it ends): the spool's offsets and its
/// emptying when all is shipped assume one writer.
fn hold(file: &File) -> io::Result<()> {
    file.try_lock().map_err(|e| match e {
        std::fs::TryLockError::WouldBlock => io::Error::new(
            io::ErrorKind::WouldBlock,
            "it is in use by another process; each replica needs a spool of its own \
             ([audit] spool, on a volume no other replica writes)",
        ),
        std::fs::TryLockError::Error(e) => e,
    })
}

fn read_range(file: &File, from: u64, to: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; to.saturating_sub(from) as usize];
    file.read_exact_at(&mut buf, from)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(method: &str, tool: Option<String>, client: Option<String>) -> Event {
        Event {
            time_ms: 1,
            method: method.to_owned(),
            tool,
            client,
            decision: "forwarded".into(),
            stage: "forwarded".into(),
            era: "2026".into(),
            violations: vec!["a\nb".into()],
            ..Default::default()
        }
    }

    proptest! {
        /// Whatever bytes an event's text holds, its line is one line and
        /// reads back as the event.
        #[test]
        fn a_spooled_event_reads_back_whole(method in any::<String>(), tool in any::<Option<String>>(),
                                            client in any::<Option<String>>(), replica in "[a-z0-9-]{1,20}") {
            let dir = tempfile::tempdir().unwrap();
            let spool = Spool::open(&dir.path().join("s.jsonl")).unwrap();
            let e = event(&method, tool, client);
            let line = encode(&Row { key: "k1", replica: &replica, event: &e });
            prop_assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
            spool.append(&line).unwrap();
            spool.append(&line).unwrap();
            let (lines, end) = spool.unshipped(10).unwrap();
            prop_assert_eq!(lines.len(), 2);
            prop_assert_eq!(end, 2 * line.len() as u64);
            let back: serde_json::Value = serde_json::from_slice(&lines[0]).unwrap();
            let mut want = serde_json::to_value(&e).unwrap();
            want["key"] = "k1".into();
            want["replica"] = replica.into();
            prop_assert_eq!(back, want);
        }
    }

    #[test]
    fn a_torn_tail_is_cut_and_the_shipped_offset_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let e = event("tools/call", None, None);
        let line = encode(&Row {
            key: "k",
            replica: "r",
            event: &e,
        });
        {
            let spool = Spool::open(&path).unwrap();
            for _ in 0..3 {
                spool.append(&line).unwrap();
            }
            let (lines, end) = spool.unshipped(1).unwrap();
            assert_eq!(lines.len(), 1);
            spool.shipped(end, 1);
            // A kill in the middle of a write leaves half a line.
            spool.append(&line[..10]).unwrap();
        }
        let spool = Spool::open(&path).unwrap();
        assert_eq!(spool.pending(), 2);
        let (lines, end) = spool.unshipped(10).unwrap();
        assert_eq!(lines.len(), 2);
        spool.shipped(end, 2);
        assert_eq!(spool.pending(), 0);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "emptied once shipped"
        );
    }

    /// A spool is one process's: two writers would each count only their own
    /// bytes, so one would ship the other's lines as its own window and, its
    /// count reached, empty the file under the other's unshipped line (and the
    /// other could no longer read its window: its events stay lost). A second
    /// opener (replicas given one volume by mistake) is refused while the
    /// first holds the spool, without touching it; free again once it is let go.
    #[test]
    fn a_spool_is_refused_to_a_second_opener_while_the_first_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let first = Spool::open(&path).unwrap();
        first.append(b"{\"key\":\"first\"}\n").unwrap();
        // Half a line, as a write under way in the first process leaves it.
        first.append(b"{\"key\":").unwrap();
        let refused = Spool::open(&path).map(|_| ()).expect_err("a second opener");
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock, "{refused}");
        assert!(
            refused.to_string().contains("in use by another process"),
            "{refused}"
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            first.tail.lock().unwrap().len,
            "the refused opener cut nothing"
        );
        drop(first);
        let again = Spool::open(&path).expect("free once the first let go");
        assert_eq!(again.pending(), 1);
    }
}
